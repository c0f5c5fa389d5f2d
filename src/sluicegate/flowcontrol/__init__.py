"""Flow control: holding requests back while the pool is saturated.

When every server that could take a request is full, sending it anyway only makes everyone
slower. With flow control on, such requests wait in the gateway in priority bands
(higher priority first), fair across flows (tenants) within a band, ordered within a flow,
bounded in count and bytes, each with a time to live. Sheddable requests (negative
priority) are refused with 429 instead of queued when the pool is saturated.
"""
