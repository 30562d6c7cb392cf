"""HTTP transport, the only folder importing requests and urllib3: abortable requests, streams."""
