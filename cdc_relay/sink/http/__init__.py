"""The HTTP sink (httpx): the sink (``sink``), its settings (``config``), one request's shape
(``requests``, with the signature scheme) and doctor's probe (``probe``)."""
