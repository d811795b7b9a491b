"""Framework integrations: one module per framework (``langchain``, ``openai_agents``,
``llama_index``, ``pydantic_ai``) and the ``mcp`` package, each importing its framework lazily
and built on the one adapter kernel (``_kernel``)."""

__all__: list[str] = []
