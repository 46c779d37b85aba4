"""The Temporal workflows of the durable-execution tests. The agents live in `agents`, imported
passed through: this module is re-imported by the sandbox for every workflow run.

`import tests.durable.agents as agents`, not `from tests.durable import agents`: this module's own
package is re-imported inside the sandbox, and the `from` form looks the submodule up on that copy,
which imports a fresh `agents` there (with no agents in it) instead of passing the worker's through.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.usage import UsageLimits

    import tests.durable.agents as agents


@workflow.defn(name='RunDurableAgent')
class RunDurableAgent:
    @workflow.run
    async def run(self, name: str, cycles: int) -> str:
        agent = agents.AGENTS[name]
        result = await agent.run(f'cycles={cycles}', usage_limits=UsageLimits(request_limit=None))
        return result.output
