-- The plugin registry: the cluster's source of truth for which plugin versions exist and
-- which one each plugin runs (host/src/store/plugin_registry.rs). Every node follows it.
-- Same logical schema as ../sqlite and ../mysql.

-- Every uploaded version, its component bytes included: a node fetches a version by its
-- SHA-256 from here (and caches it on disk). A (name, version) is written once.
CREATE TABLE plugin_versions (
    name        TEXT   NOT NULL,
    version     TEXT   NOT NULL,
    sha256      TEXT   NOT NULL,
    manifest    TEXT   NOT NULL,
    component   BYTEA  NOT NULL,
    size        BIGINT NOT NULL,
    contract    TEXT   NOT NULL,
    uploaded_ms BIGINT NOT NULL,
    uploaded_by TEXT   NOT NULL,
    PRIMARY KEY (name, version)
);

-- Per plugin: what runs; `generation` only grows; `pending_*` is a deploy under way,
-- `pending_phase` NULL while the nodes prepare it and 'switching' once they are held
-- for the switch.
CREATE TABLE plugin_deployments (
    name             TEXT   NOT NULL PRIMARY KEY,
    active_version   TEXT,
    shadow_version   TEXT,
    previous_version TEXT,
    canary           TEXT,
    generation       BIGINT NOT NULL,
    pending_id       TEXT,
    pending_version  TEXT,
    pending_as       TEXT,
    pending_since_ms BIGINT,
    pending_phase    TEXT,
    updated_ms       BIGINT NOT NULL
);

-- The audit trail: each upload, deploy, promote and rollback, when, by which key, from
-- which version to which.
CREATE TABLE plugin_audit (
    id           BIGSERIAL PRIMARY KEY,
    name         TEXT   NOT NULL,
    action       TEXT   NOT NULL,
    from_version TEXT,
    to_version   TEXT,
    key_id       TEXT   NOT NULL,
    at_ms        BIGINT NOT NULL,
    detail       TEXT
);
CREATE INDEX plugin_audit_name ON plugin_audit (name, id);

-- What each node reports of each plugin (JSON).
CREATE TABLE plugin_node_reports (
    node_id    BIGINT NOT NULL,
    name       TEXT   NOT NULL,
    report     TEXT   NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (node_id, name)
);
