"""A store whose every printed field holds terminal control sequences, as a hostile writer would leave it.

`EVIL` sets the window title (OSC ... BEL), clears the screen (CSI 2J), starts a C1 CSI, reverses
the text direction (RLO, LRI, the RLM, LRM and ALM marks), breaks the line (the line and paragraph
separators), and carries DEL, CR, BS and NUL: each would act on a terminal if printed raw.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from pydantic_ai_steps.step_persistence import ContinuableSnapshot, RunRecord, StepEvent, StepStore, ToolEffectRecord

EVIL = '\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e\u2066\u200f\u200e\u061c\u2028\u2029\x7f\r\x08\x00|'
"""Every kind of character that must not reach a terminal raw, in one string."""
EVIL_SHOWN = r'\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e\u2066\u200f\u200e\u061c\u2028\u2029\x7f\r\x08\x00|'
"""How the CLI shows `EVIL`: each such character as its escape, the rest as it is."""
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def hostile_run_id(kind: str) -> str:
    """No store of this package writes such a run id; in SQLite another program can (`rename_to_hostile`)."""
    return 'evil-run' if kind == 'file' else 'evil-run-' + EVIL


def rename_to_hostile(database: Path) -> None:
    """What another program writing the same database can leave: a run id full of control sequences."""
    with sqlite3.connect(database) as connection:
        for table in ('runs', 'events', 'tool_effects', 'snapshots', 'messages', 'snapshot_idempotency_keys'):
            connection.execute(
                f'UPDATE {table} SET run_id = ? WHERE run_id = ?', (hostile_run_id('sqlite'), 'evil-run')
            )
        connection.execute(
            'UPDATE runs SET parent_run_id = ? WHERE run_id = ?', (hostile_run_id('sqlite'), 'evil-child')
        )


def _messages() -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[
                SystemPromptPart(EVIL, timestamp=T0),
                UserPromptPart(
                    [
                        f'first line {EVIL}\nsecond\tline',
                        BinaryContent(b'\x89PNG', media_type=f'image/{EVIL}'),
                        ImageUrl(url=f'https://example.com/{EVIL}'),
                    ],
                    timestamp=T0,
                ),
            ],
            instructions=f'instructions {EVIL}',
            timestamp=T0,
        ),
        ModelResponse(
            parts=[
                ThinkingPart(f'thinking {EVIL}'),
                TextPart(f'text {EVIL}'),
                ToolCallPart(EVIL, {EVIL: EVIL}, tool_call_id=f'call-{EVIL}'),
            ],
            model_name=f'model-{EVIL}',
            timestamp=T0,
        ),
        ModelRequest(
            parts=[
                ToolReturnPart(EVIL, f'returned {EVIL}', tool_call_id=f'call-{EVIL}', timestamp=T0),
                RetryPromptPart(f'retry {EVIL}', tool_name=EVIL, tool_call_id=f'retry-{EVIL}', timestamp=T0),  # pyright: ignore[reportDeprecated]
            ]
        ),
    ]


async def populate_hostile(store: StepStore, kind: str) -> str:
    """One run (and a delegate of it) whose every field the CLI prints carries `EVIL`; returns its id."""
    del kind  # written as a plain id: `rename_to_hostile` gives the SQLite one its hostile name
    run_id = 'evil-run'
    await store.register_run(
        RunRecord(
            run_id=run_id,
            agent_name=f'agent-{EVIL}',
            conversation_id=f'conv-{EVIL}',
            parent_run_id=f'parent-{EVIL}',
            metadata={f'key-{EVIL}': f'value-{EVIL}'},
            started_at=T0,
        )
    )
    await store.register_run(
        RunRecord(run_id='evil-child', agent_name=f'child-{EVIL}', parent_run_id=run_id, started_at=T0)
    )
    for index, (kind_, error) in enumerate(
        [('run_started', None), ('tool_call_started', None), ('tool_call_failed', f'error {EVIL}\nline two')]
    ):
        await store.append_event(
            StepEvent(
                run_id=run_id,
                kind=kind_,  # type: ignore[arg-type]
                step_index=index,
                timestamp=T0 + timedelta(seconds=index),
                agent_name=f'agent-{EVIL}',
                conversation_id=f'conv-{EVIL}',
                tool_name=EVIL if kind_ != 'run_started' else None,
                tool_call_id=f'call-{EVIL}' if kind_ != 'run_started' else None,
                error=error,
                metadata={f'key-{EVIL}': EVIL},
                idempotency_key=f'{index}',
            )
        )
    await store.record_tool_effect(
        ToolEffectRecord(
            tool_call_id=f'call-{EVIL}',
            tool_name=EVIL,
            run_id=run_id,
            status='started',
            started_at=T0,
            idempotency_key=f'key-{EVIL}',
            effect_summary=f'summary {EVIL}',
        )
    )
    await store.save_snapshot(
        ContinuableSnapshot(
            run_id=run_id,
            step_index=2,
            messages=_messages(),
            conversation_id=f'conv-{EVIL}',
            agent_name=f'agent-{EVIL}',
            timestamp=T0,
        )
    )
    return run_id
