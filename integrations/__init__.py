"""Framework integrations: one module per framework (``langchain``, ``openai_agents``,
``llama_index``, ``pydantic_ai``), the ``mcp`` package and the ``durable`` engines (``dbos``,
``temporal``), each importing its framework lazily and built on the one adapter kernel
(``_kernel``) or on ``gate.effect``."""

__all__: list[str] = []
