-- skiplock schema, version 14: the trace context an outbox message was put under (OpenTelemetry,
-- opt-in), so a relay's deliver span links to the span that put the message (observability/tracing.py).
--
-- outbox_traces: one row per message put while tracing was on -- the propagator's carrier (W3C
-- traceparent/tracestate) as JSON. A side table, as job_traces (migration 11) is for jobs, so the put
-- and every relay statement stay exactly as they are when tracing is off (the default).
-- The row is written by the put's own statement sequence, in the same transaction as the message
-- (outbox.sql `store_outbox_traces`): a rolled-back put leaves neither. The foreign key costs no wait:
-- its KEY SHARE lock is on a row that same transaction has just inserted, which no one else can see
-- yet; and the relay's later writes to the message (FOR NO KEY UPDATE) do not conflict with it.
-- ON DELETE CASCADE: pruning a message (outbox prune) removes its trace context too.
CREATE TABLE {schema}.outbox_traces (
    message_id bigint PRIMARY KEY REFERENCES {schema}.outbox (id) ON DELETE CASCADE,
    carrier jsonb NOT NULL
);
