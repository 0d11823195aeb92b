-- skiplock schema, version 11: the trace context a job was enqueued under (OpenTelemetry, opt-in).
--
-- job_traces: one row per job enqueued while tracing was on -- the propagator's carrier (W3C
-- traceparent/tracestate) as JSON. A side table, not a column of jobs, so that enqueue, enqueue_many's
-- COPY and every claim statement stay exactly as they are when tracing is off (the default).
-- No foreign key on purpose: one would make the insert take a KEY SHARE lock on the job's row, which a
-- worker's FOR UPDATE lease blocks. A row is consumed (deleted) by the claim transaction that reads
-- it (see tracing.sql), so rows do not outlive their job's first committed attempt.
CREATE TABLE {schema}.job_traces (
    job_id bigint PRIMARY KEY,
    carrier jsonb NOT NULL
);
