"""The agent frameworks a topology runs on: the modules each needs and the pip command that installs it.

Data only, so what must not load a runner or a model client (re-scoring, the provenance of a cell's
summary) can read it; topologies/registry.py imports these modules at cell start, so a missing
framework fails the cell there with the command that fixes it.
"""

from __future__ import annotations

# framework -> (modules it needs, imported at cell start; the pip command that installs them)
FRAMEWORKS: dict[str, tuple[tuple[str, ...], str]] = {
    # everything the LangGraph runners import lazily, so the first problem does not pay for it
    "langgraph": (
        (
            "langgraph.graph",
            "langgraph.types",
            "langgraph.errors",
            "langchain_core.messages",
            "langchain_core.tools",
            "langchain_openai",
            "openai.resources",
            "langchain_core.tracers.stdout",
        ),
        "pip install apps-bench",
    ),
    "crewai": (("crewai",), "pip install 'apps-bench[crewai]'"),
    "autogen": (("autogen_agentchat", "autogen_ext.models.openai"), "pip install 'apps-bench[autogen]'"),
    "openai": (("openai", "openai.resources"), "pip install apps-bench"),  # the SDK loads resources on first use
}
