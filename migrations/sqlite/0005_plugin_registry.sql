-- The plugin registry: the cluster's source of truth for which plugin versions exist and
-- which one each plugin runs (host/src/store/plugin_registry.rs). Every node follows it.

-- Every uploaded version, its component bytes included: a node fetches a version by its
-- SHA-256 from here (and caches it on disk). A (name, version) is written once.
CREATE TABLE plugin_versions (
    name        TEXT   NOT NULL,
    version     TEXT   NOT NULL,
    sha256      TEXT   NOT NULL,   -- `sha256:<hex>` of the component
    manifest    TEXT   NOT NULL,   -- the manifest's TOML text, '' when none was given
    component   BLOB   NOT NULL,
    size        BIGINT NOT NULL,
    contract    TEXT   NOT NULL,   -- the herald:plugin contract version it targets
    uploaded_ms BIGINT NOT NULL,
    uploaded_by TEXT   NOT NULL,   -- the id of the admin key (never the key)
    PRIMARY KEY (name, version)
);

-- Per plugin: what runs. `generation` only grows: every switch increments it, and a node
-- that applied a lower one has something to do. `pending_*` is a deploy under way (its
-- first phase: nodes compile and warm the version and report), at most one per plugin.
CREATE TABLE plugin_deployments (
    name             TEXT   NOT NULL PRIMARY KEY,
    active_version   TEXT,
    shadow_version   TEXT,
    previous_version TEXT,            -- what a rollback goes back to
    canary           TEXT,            -- JSON: the canary watch of the last promotion
    generation       BIGINT NOT NULL,
    pending_id       TEXT,
    pending_version  TEXT,
    pending_as       TEXT,            -- `active` or `shadow`
    pending_since_ms BIGINT,
    pending_phase    TEXT,
    updated_ms       BIGINT NOT NULL
);

-- The audit trail: each upload, deploy, promote and rollback (and each refused or aborted
-- one), when, by which key, from which version to which.
CREATE TABLE plugin_audit (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT   NOT NULL,
    action       TEXT   NOT NULL,
    from_version TEXT,
    to_version   TEXT,
    key_id       TEXT   NOT NULL,
    at_ms        BIGINT NOT NULL,
    detail       TEXT
);
CREATE INDEX plugin_audit_name ON plugin_audit (name, id);

-- What each node reports of each plugin (JSON): the versions it serves, whether it is
-- ready for a pending deploy or why not, its shadow comparisons and call counts; a deploy
-- waits on these, and /admin/plugins shows them.
CREATE TABLE plugin_node_reports (
    node_id    BIGINT NOT NULL,
    name       TEXT   NOT NULL,
    report     TEXT   NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (node_id, name)
);
