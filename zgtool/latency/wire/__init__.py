"""The wire: one instrumented request (httpcore transport with kernel receive times, the client, the
SSE stream reader) and the API detection that asks a bare URL what it speaks."""
