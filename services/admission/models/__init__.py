"""The gateway's API models (request and response bodies), one module per route group,
with the functions that build a response from the read model's rows."""
