"""The HTTP API v1 (DESIGN.md section 4), served by every node with aiohttp."""
