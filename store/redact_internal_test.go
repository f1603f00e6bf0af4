package store

import "testing"

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"mongodb://h:27017/db":                       "mongodb://h:27017/db",
		"mongodb://alice@h/db":                       "mongodb://alice@h/db",
		"mongodb://alice:pw@h1,h2/db?replicaSet=rs0": "mongodb://alice:xxxxx@h1,h2/db?replicaSet=rs0",
		"mongodb://alice:p@ss/w@h/db?w=majority":     "mongodb://alice:xxxxx@h/db?w=majority",
		"mongodb+srv://bob:s3cret@cluster.example/":  "mongodb+srv://bob:xxxxx@cluster.example/",
		"mongodb://h/db?appName=a@b":                 "mongodb://h/db?appName=a@b",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
