package sqlitestore

// SchemaVersion is the schema version a writer upgrades a store to.
const SchemaVersion = schemaVersion
