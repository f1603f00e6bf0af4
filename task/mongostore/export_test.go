package mongostore

// SetBeforeSend installs a hook the updater runs before sending each batch
// (n requests); set it before the store's first Update.
func SetBeforeSend(s *Store, f func(n int)) { s.beforeSend = f }

// QueuedUpdates is how many Updates wait for the updater.
func QueuedUpdates(s *Store) int {
	n := 0
	for _, q := range s.updqs {
		n += len(q)
	}
	return n
}
