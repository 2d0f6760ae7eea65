-- The plugin registry: the cluster's source of truth for which plugin versions exist and
-- which one each plugin runs (host/src/store/plugin_registry.rs). Every node follows it.
-- Same logical schema as ../sqlite and ../postgres. Names and versions are ASCII
-- ([A-Za-z0-9._+-], checked by the API) compared byte-wise.

-- Every uploaded version, its component bytes included: a node fetches a version by its
-- SHA-256 from here (and caches it on disk). A (name, version) is written once.
CREATE TABLE plugin_versions (
    name        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sha256      VARCHAR(80)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    manifest    MEDIUMTEXT   NOT NULL,
    component   LONGBLOB     NOT NULL,
    size        BIGINT       NOT NULL,
    contract    VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    uploaded_ms BIGINT       NOT NULL,
    uploaded_by VARCHAR(80)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (name, version)
) ENGINE = InnoDB;

-- Per plugin: what runs; `generation` only grows; `pending_*` is a deploy under way,
-- `pending_phase` NULL while the nodes prepare it and 'switching' once they are held
-- for the switch.
CREATE TABLE plugin_deployments (
    name             VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    active_version   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    shadow_version   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    previous_version VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    canary           TEXT,
    generation       BIGINT NOT NULL,
    pending_id       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    pending_version  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    pending_as       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin,
    pending_since_ms BIGINT,
    pending_phase    VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin,
    updated_ms       BIGINT NOT NULL
) ENGINE = InnoDB;

-- The audit trail: each upload, deploy, promote and rollback, when, by which key, from
-- which version to which.
CREATE TABLE plugin_audit (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    from_version VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    to_version   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    key_id       VARCHAR(80) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at_ms        BIGINT NOT NULL,
    detail       TEXT,
    KEY plugin_audit_name (name, id)
) ENGINE = InnoDB;

-- What each node reports of each plugin (JSON).
CREATE TABLE plugin_node_reports (
    node_id    BIGINT NOT NULL,
    name       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    report     MEDIUMTEXT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (node_id, name)
) ENGINE = InnoDB;
