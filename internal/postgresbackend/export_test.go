package postgresbackend

// Unexported values the external tests check against their definitions.
const SchemaLock = schemaLock
