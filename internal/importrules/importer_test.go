package importrules

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImporterBuildsPatchedBroker builds what a program importing
// leasepool builds: a module outside the repository that requires
// leasepool (replaced by this checkout, as a user's own replace would)
// and imports mqttdev/broker. A replace in leasepool's go.mod would not
// apply there, so the fixed MQTT server must come from inside the module:
// the program must link internal/mochi, with the locked retained-path read
// of its topics.go, and no package of github.com/mochi-mqtt/server.
func TestImporterBuildsPatchedBroker(t *testing.T) {
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module example.com/importer\n\ngo 1.26.0\n\n" +
		"require " + module + " v0.0.0\n\n" +
		"replace " + module + " => " + repo + "\n"
	main := "package main\n\nimport \"" + module + "/mqttdev/broker\"\n\n" +
		"func main() { _ = broker.Listen }\n"
	for name, text := range map[string]string{"go.mod": goMod, "main.go": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}", ".")
	cmd.Dir = dir
	// -mod=mod lets go write the importer's go.sum; GOWORK=off keeps a
	// workspace around the temporary directory out of it. GOPROXY and the
	// module cache are the environment's.
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps in the importing module: %v\n%s", err, stderr.String())
	}

	mochi := module + "/internal/mochi"
	var mochiDir string
	var sawBroker bool
	for line := range strings.Lines(string(out)) {
		path, pkgDir, _ := strings.Cut(strings.TrimSpace(line), "\t")
		switch {
		case path == module+"/mqttdev/broker":
			sawBroker = true
		case path == mochi:
			mochiDir = pkgDir
		case strings.HasPrefix(path, "github.com/mochi-mqtt/server"):
			t.Errorf("the importing program links %s (%s), the published MQTT server with its data race", path, pkgDir)
		}
	}
	if !sawBroker {
		t.Fatalf("go list -deps did not report %s/mqttdev/broker; the list read is not the importer's:\n%s", module, out)
	}
	if mochiDir == "" {
		t.Fatalf("the importing program does not link %s", mochi)
	}
	if want := filepath.Join(repo, "internal", "mochi"); mochiDir != want {
		t.Errorf("%s builds from %s, want %s", mochi, mochiDir, want)
	}
	topics, err := os.ReadFile(filepath.Join(mochiDir, "topics.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(topics, []byte("func (n *particle) retained() string")) {
		t.Errorf("%s/topics.go has no locked read of the retained path (particle.retained)", mochiDir)
	}
}
