-- Written by tests/postgres/make_upstream_fixture.py with pydantic-ai-harness 0.62.0 (pg_dump --inserts):
-- the tables its PostgresStepStore(pool, table="upstream_fx") created and the rows it wrote.
CREATE TABLE upstream_fx_events (
    seq bigint NOT NULL,
    run_id text NOT NULL,
    kind text NOT NULL,
    step_index integer NOT NULL,
    "timestamp" text NOT NULL,
    conversation_id text,
    parent_run_id text,
    agent_name text,
    tool_call_id text,
    tool_name text,
    error text,
    metadata text NOT NULL,
    idempotency_key text
);
ALTER TABLE upstream_fx_events ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME upstream_fx_events_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE upstream_fx_media (
    sha256 text NOT NULL,
    media_type text,
    bytes bytea NOT NULL,
    size_bytes bigint NOT NULL,
    metadata text
);
CREATE TABLE upstream_fx_messages (
    sha256 text NOT NULL,
    message text NOT NULL
);
CREATE TABLE upstream_fx_runs (
    run_id text NOT NULL,
    conversation_id text,
    parent_run_id text,
    agent_name text,
    metadata text NOT NULL,
    started_at text NOT NULL,
    registration_id text
);
CREATE TABLE upstream_fx_snapshot_keys (
    run_id text NOT NULL,
    idempotency_key text NOT NULL
);
CREATE TABLE upstream_fx_snapshots (
    seq bigint NOT NULL,
    run_id text NOT NULL,
    step_index integer NOT NULL,
    conversation_id text,
    parent_run_id text,
    agent_name text,
    "timestamp" text NOT NULL,
    state text DEFAULT 'complete'::text NOT NULL,
    messages text NOT NULL,
    idempotency_key text
);
ALTER TABLE upstream_fx_snapshots ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME upstream_fx_snapshots_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE upstream_fx_tool_effects (
    run_id text NOT NULL,
    tool_call_id text NOT NULL,
    tool_name text NOT NULL,
    status text NOT NULL,
    started_at text NOT NULL,
    ended_at text,
    idempotency_key text,
    effect_summary text
);
INSERT INTO upstream_fx_events OVERRIDING SYSTEM VALUE VALUES (1, 'up-1', 'run_started', 0, '2026-03-01T12:00:02+00:00', NULL, NULL, NULL, NULL, NULL, NULL, '{}', '0:0:run_started:');
INSERT INTO upstream_fx_events OVERRIDING SYSTEM VALUE VALUES (2, 'up-1', 'tool_call_started', 1, '2026-03-01T12:00:03+00:00', NULL, NULL, NULL, 'c1', 'search', NULL, '{}', '1:1:tool_call_started:c1');
INSERT INTO upstream_fx_events OVERRIDING SYSTEM VALUE VALUES (3, 'up-1', 'tool_call_completed', 1, '2026-03-01T12:00:04+00:00', NULL, NULL, NULL, 'c1', 'search', NULL, '{}', '2:1:tool_call_completed:c1');
INSERT INTO upstream_fx_events OVERRIDING SYSTEM VALUE VALUES (4, 'up-1', 'run_completed', 2, '2026-03-01T12:00:07+00:00', NULL, NULL, NULL, NULL, NULL, NULL, '{}', NULL);
INSERT INTO upstream_fx_media VALUES ('10fc3c51a152e90e5b90319b601d92ccf37290ef53c35ff92507687d8a911a08', 'image/png', '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff', 2048, '{}');
INSERT INTO upstream_fx_messages VALUES ('1fa3a99743196d0859a59d5b7749a5087b96b0967ec628e45197501a763f7b2d', '{"parts":[{"content":"find the docs","timestamp":"2026-03-01T12:00:00Z","part_kind":"user-prompt"}],"timestamp":null,"instructions":null,"kind":"request","run_id":null,"conversation_id":null,"metadata":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('4654e05b570de7e5fb775271b0b0af67d4f21ead99d52134e880444d72fe6d2a', '{"parts":[{"tool_name":"search","content":"result 0","tool_call_id":"c1","tool_kind":null,"metadata":null,"timestamp":"2026-03-01T12:00:00Z","outcome":"success","retry":null,"part_kind":"tool-return"}],"timestamp":null,"instructions":null,"kind":"request","run_id":null,"conversation_id":null,"metadata":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('5ac6c96207d0748c091aeeb61d638e79476e060b0df3ef07595dbcd69e79e012', '{"parts":[{"tool_name":"search","args":{"page":0},"tool_call_id":"c1","tool_kind":null,"id":null,"provider_name":null,"provider_details":null,"part_kind":"tool-call"}],"usage":{"input_tokens":0,"cache_write_tokens":0,"cache_write_1h_tokens":0,"cache_read_tokens":0,"output_tokens":0,"output_reasoning_tokens":0,"input_audio_tokens":0,"cache_audio_read_tokens":0,"output_audio_tokens":0,"audio_seconds":0.0,"details":{},"cost":null},"model_name":null,"timestamp":"2026-03-01T12:00:00Z","kind":"response","provider_name":null,"provider_url":null,"provider_details":null,"provider_response_id":null,"finish_reason":null,"run_id":null,"conversation_id":null,"metadata":null,"workspace_ref":null,"history_digest":null,"failed_attempts":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('6074c5ba05dbcbae25e0ce568d641eb99d506c27fe79e5614e9f2e686e607dc7', '{"parts":[{"tool_name":"search","content":"result 1","tool_call_id":"c2","tool_kind":null,"metadata":null,"timestamp":"2026-03-01T12:00:00Z","outcome":"success","retry":null,"part_kind":"tool-return"}],"timestamp":null,"instructions":null,"kind":"request","run_id":null,"conversation_id":null,"metadata":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('7d4c2446da1c833bdb5c56edf61d0b600b4d76af02d2082a1083cd15aaa67bc6', '{"parts":[{"tool_name":"search","args":{"page":1},"tool_call_id":"c2","tool_kind":null,"id":null,"provider_name":null,"provider_details":null,"part_kind":"tool-call"}],"usage":{"input_tokens":0,"cache_write_tokens":0,"cache_write_1h_tokens":0,"cache_read_tokens":0,"output_tokens":0,"output_reasoning_tokens":0,"input_audio_tokens":0,"cache_audio_read_tokens":0,"output_audio_tokens":0,"audio_seconds":0.0,"details":{},"cost":null},"model_name":null,"timestamp":"2026-03-01T12:00:00Z","kind":"response","provider_name":null,"provider_url":null,"provider_details":null,"provider_response_id":null,"finish_reason":null,"run_id":null,"conversation_id":null,"metadata":null,"workspace_ref":null,"history_digest":null,"failed_attempts":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('4f627917f3f6b2d32de0d9bd35f031c07b012b08b7435fd2327aee658deb889e', '{"parts":[{"content":"a gradient","id":null,"provider_name":null,"provider_details":null,"citations":null,"part_kind":"text"}],"usage":{"input_tokens":0,"cache_write_tokens":0,"cache_write_1h_tokens":0,"cache_read_tokens":0,"output_tokens":0,"output_reasoning_tokens":0,"input_audio_tokens":0,"cache_audio_read_tokens":0,"output_audio_tokens":0,"audio_seconds":0.0,"details":{},"cost":null},"model_name":null,"timestamp":"2026-03-01T12:00:00Z","kind":"response","provider_name":null,"provider_url":null,"provider_details":null,"provider_response_id":null,"finish_reason":null,"run_id":null,"conversation_id":null,"metadata":null,"workspace_ref":null,"history_digest":null,"failed_attempts":null,"state":"complete"}');
INSERT INTO upstream_fx_messages VALUES ('aab619674d6424618fd775746d99dfb8b36423cb222fe9c2f441e9abe2df36dc', '{"parts":[{"content":["look",{"media_type":"image/png","vendor_metadata":null,"kind":"binary","identifier":"f10ccf","__harness_external_media__":true,"__harness_external_urlsafe__":"base64-urlsafe-v1","__harness_external_uri__":"media+sha256://10fc3c51a152e90e5b90319b601d92ccf37290ef53c35ff92507687d8a911a08","uri":"media+sha256://10fc3c51a152e90e5b90319b601d92ccf37290ef53c35ff92507687d8a911a08"}],"timestamp":"2026-03-01T12:00:00Z","part_kind":"user-prompt"}],"timestamp":null,"instructions":null,"kind":"request","run_id":null,"conversation_id":null,"metadata":null,"state":"complete"}');
INSERT INTO upstream_fx_runs VALUES ('up-1', 'conv-up', NULL, 'librarian', '{"team": "docs"}', '2026-03-01T12:00:00+00:00', 'reg-1');
INSERT INTO upstream_fx_runs VALUES ('up-2', 'c2', 'up-1', 'helper', '{}', '2026-03-01T12:00:01+00:00', NULL);
INSERT INTO upstream_fx_snapshot_keys VALUES ('up-1', '0:1:complete');
INSERT INTO upstream_fx_snapshots OVERRIDING SYSTEM VALUE VALUES (1, 'up-1', 1, NULL, NULL, NULL, '2026-03-01T12:00:05+00:00', 'complete', '{"message_refs": ["1fa3a99743196d0859a59d5b7749a5087b96b0967ec628e45197501a763f7b2d", "5ac6c96207d0748c091aeeb61d638e79476e060b0df3ef07595dbcd69e79e012", "4654e05b570de7e5fb775271b0b0af67d4f21ead99d52134e880444d72fe6d2a"]}', '0:1:complete');
INSERT INTO upstream_fx_snapshots OVERRIDING SYSTEM VALUE VALUES (2, 'up-1', 2, NULL, NULL, NULL, '2026-03-01T12:00:06+00:00', 'complete', '{"message_refs": ["1fa3a99743196d0859a59d5b7749a5087b96b0967ec628e45197501a763f7b2d", "5ac6c96207d0748c091aeeb61d638e79476e060b0df3ef07595dbcd69e79e012", "4654e05b570de7e5fb775271b0b0af67d4f21ead99d52134e880444d72fe6d2a", "7d4c2446da1c833bdb5c56edf61d0b600b4d76af02d2082a1083cd15aaa67bc6", "6074c5ba05dbcbae25e0ce568d641eb99d506c27fe79e5614e9f2e686e607dc7"]}', NULL);
INSERT INTO upstream_fx_snapshots OVERRIDING SYSTEM VALUE VALUES (3, 'up-2', 1, NULL, NULL, NULL, '2026-03-01T12:00:09+00:00', 'interrupted', '{"message_refs": ["aab619674d6424618fd775746d99dfb8b36423cb222fe9c2f441e9abe2df36dc", "4f627917f3f6b2d32de0d9bd35f031c07b012b08b7435fd2327aee658deb889e"]}', NULL);
INSERT INTO upstream_fx_tool_effects VALUES ('up-1', 'c1', 'search', 'completed', '2026-03-01T12:00:03+00:00', '2026-03-01T12:00:04+00:00', 'search::1', 'read page 0');
INSERT INTO upstream_fx_tool_effects VALUES ('up-2', 'x1', 'post', 'started', '2026-03-01T12:00:08+00:00', NULL, NULL, NULL);
SELECT pg_catalog.setval('upstream_fx_events_seq_seq', 4, true);
SELECT pg_catalog.setval('upstream_fx_snapshots_seq_seq', 3, true);
ALTER TABLE ONLY upstream_fx_events
    ADD CONSTRAINT upstream_fx_events_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY upstream_fx_media
    ADD CONSTRAINT upstream_fx_media_pkey PRIMARY KEY (sha256);
ALTER TABLE ONLY upstream_fx_messages
    ADD CONSTRAINT upstream_fx_messages_pkey PRIMARY KEY (sha256);
ALTER TABLE ONLY upstream_fx_runs
    ADD CONSTRAINT upstream_fx_runs_pkey PRIMARY KEY (run_id);
ALTER TABLE ONLY upstream_fx_snapshot_keys
    ADD CONSTRAINT upstream_fx_snapshot_keys_pkey PRIMARY KEY (run_id, idempotency_key);
ALTER TABLE ONLY upstream_fx_snapshots
    ADD CONSTRAINT upstream_fx_snapshots_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY upstream_fx_tool_effects
    ADD CONSTRAINT upstream_fx_tool_effects_pkey PRIMARY KEY (run_id, tool_call_id);
CREATE UNIQUE INDEX upstream_fx_events_key_idx ON upstream_fx_events USING btree (run_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);
CREATE INDEX upstream_fx_events_run_idx ON upstream_fx_events USING btree (run_id, seq);
CREATE INDEX upstream_fx_runs_conv_idx ON upstream_fx_runs USING btree (conversation_id);
CREATE INDEX upstream_fx_runs_parent_idx ON upstream_fx_runs USING btree (parent_run_id);
CREATE INDEX upstream_fx_snapshots_run_idx ON upstream_fx_snapshots USING btree (run_id, seq);
