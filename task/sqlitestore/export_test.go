package sqlitestore

// SchemaVersion is the schema version a writer upgrades a store to.
const SchemaVersion = schemaVersion

// Serving reports whether s is its file's writer (share.go).
func (s *Store) Serving() bool {
	if s.share == nil {
		return false
	}
	s.share.mu.Lock()
	defer s.share.mu.Unlock()
	return s.share.server != nil
}

// Forwarding reports whether s sends its writes to the file's writer.
func (s *Store) Forwarding() bool { return s.writerConn() != nil }

// SocketPath is the writer's socket for the store file at path.
func SocketPath(path string) string { return socketPath(path) }
