-- Schema version 3: where each host can be reached, so a client that asks one host for a
-- session another host serves is told where to go.
--
-- A host writes its row when it starts and renews `seen_at` with every heartbeat; a row
-- not renewed for a while belongs to a host that died (its sessions' leases expire too,
-- and another host takes them over). The address is what a client connects to (a
-- WebSocket URL, for example); the library never connects to it itself.
CREATE TABLE chat_hosts (
    host_id BYTEA       PRIMARY KEY,
    address TEXT        NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL
);
