-- Schema version 2: what several hosts on one database share beyond the seed's tables.
--
-- The seed keeps the run registry in one process's memory; with several hosts it must be
-- shared, so that a session has one active run across hosts (OB-14), and each run and
-- each claim on a session carries a lease that its host renews, so the run or the
-- session of a host that died is taken over by another host once the lease has expired.
-- Every time here is the database server's clock (clock_timestamp()), the one clock all
-- hosts share: hosts' own clocks may disagree.

-- One active run per app session (the primary key is the rule).
CREATE TABLE chat_active_runs (
    app_session_id       BYTEA       PRIMARY KEY,
    -- The base session of the scope (the session without its alias suffix).
    base_session_id      BYTEA       NOT NULL,
    run_id               BYTEA       NOT NULL,
    -- The host that started the run and runs its agent.
    host_id              BYTEA       NOT NULL,
    started_by           BYTEA,
    last_session_message BYTEA,
    access               TEXT CHECK (access IN ('read-only', 'workspace-write', 'full-access', 'unrestricted')),
    -- Newest activity; a run whose newest activity is older than the stale limit (45 s)
    -- may be reclaimed.
    last_activity        TIMESTAMPTZ NOT NULL,
    -- Until when the host vouches for the run; another host reclaims a stale run only
    -- after this.
    lease_until          TIMESTAMPTZ NOT NULL,
    finalizing           BOOLEAN     NOT NULL DEFAULT false
);
CREATE INDEX chat_active_runs_by_scope ON chat_active_runs (base_session_id);
CREATE INDEX chat_active_runs_by_host ON chat_active_runs (host_id);

-- Pending cancellations; a new run waits while its scope has one whose lease holds.
CREATE TABLE chat_run_cancellations (
    app_session_id  BYTEA       NOT NULL,
    run_id          BYTEA       NOT NULL,
    base_session_id BYTEA       NOT NULL,
    host_id         BYTEA       NOT NULL,
    lease_until     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (app_session_id, run_id)
);
CREATE INDEX chat_run_cancellations_by_scope ON chat_run_cancellations (base_session_id);

-- Which host holds a session's scope (its outbox, its drain): one row per base session.
-- The token rises with every change of holder and fences the writes of a host that lost
-- the lease.
CREATE TABLE chat_session_leases (
    base_session_id BYTEA       PRIMARY KEY,
    host_id         BYTEA       NOT NULL,
    token           BIGINT      NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE chat_session_lease_tokens AS BIGINT MINVALUE 1 NO CYCLE;
