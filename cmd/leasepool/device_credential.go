package main

// The device credentials: `device add`, `rotate`, `revoke`, `credentials`,
// and the simulator's own.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

func deviceCredentialCommands() []*cli.Command {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print {id, username, secret} as JSON"}
	return []*cli.Command{
		{
			Name:      "add",
			Usage:     "give a device its MQTT credential (user name = its id) and print the secret, once; it is vouched for, so rollouts may select it",
			ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "rotate", Usage: "replace the credential of a device that has one"},
				jsonFlag,
			},
			Action: func(c *cli.Context) error {
				return provisionCommand(c, func(ctx context.Context, s task.Store, id string) (string, error) {
					secret, err := mqttdev.Provision(ctx, s, id, c.Bool("rotate"))
					if errors.Is(err, credential.ErrExists) {
						return "", fmt.Errorf("%w: `leasepool device rotate %s` replaces it", err, id)
					}
					return secret, err
				})
			},
		},
		{
			Name:      "rotate",
			Usage:     "replace a device's MQTT credential and print the new secret, once; the old one stops working within seconds",
			ArgsUsage: "ID",
			Flags:     []cli.Flag{jsonFlag},
			Action: func(c *cli.Context) error {
				return provisionCommand(c, func(ctx context.Context, s task.Store, id string) (string, error) {
					return credential.Rotate(ctx, s, id)
				})
			},
		},
		{
			Name:      "revoke",
			Usage:     "delete a device's MQTT credential: the embedded broker refuses it and drops its connection within seconds; a vouching that came with the credential goes too",
			ArgsUsage: "ID",
			Action: func(c *cli.Context) error {
				id, err := credentialArg(c)
				if err != nil {
					return err
				}
				s, err := openStore(c, true)
				if err != nil {
					return err
				}
				defer s.Close()
				if err := mqttdev.Deprovision(c.Context, s, id); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "device %s: credential revoked\n", id)
				return nil
			},
		},
		{
			Name:  "credentials",
			Usage: "list the devices that have an MQTT credential (never the secrets)",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				s, err := openStoreReadOnly(c)
				if err != nil {
					return err
				}
				defer s.Close()
				list, err := credential.List(c.Context, s)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return writeJSON(c.App.Writer, list)
				}
				tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "DEVICE\tSINCE")
				for _, cr := range list {
					fmt.Fprintf(tw, "%s\t%s\n", cr.ID, cr.CreatedAt.Format("2006-01-02 15:04:05Z07:00"))
				}
				return tw.Flush()
			},
		},
	}
}

// credentialArg reads the one device id argument.
func credentialArg(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", badUsage(c, "want one device ID, got %d arguments", c.NArg())
	}
	id := c.Args().First()
	if err := credential.ValidateDeviceID(id); err != nil {
		return "", err
	}
	return id, nil
}

// provisionCommand runs make for the device id argument and prints the
// secret it returns: alone on stdout (for a script), or as JSON.
func provisionCommand(c *cli.Context, make func(context.Context, task.Store, string) (string, error)) error {
	id, err := credentialArg(c)
	if err != nil {
		return err
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	secret, err := make(c.Context, s, id)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, map[string]string{"id": id, "username": id, "secret": secret})
	}
	fmt.Fprintf(c.App.ErrWriter, "device %s: MQTT user name %s; the secret below is its password, shown this once (the store keeps its hash only)\n", id, id)
	fmt.Fprintln(c.App.Writer, secret)
	return nil
}

// simSecrets are the simulated devices' credentials: read from --credentials
// (lines ID:SECRET), or, when --store is given, made in the store for each
// device (replacing one made for a simulated device; refusing to replace
// any other). Neither: none, the devices log in with --mqtt-user, if any.
func simSecrets(c *cli.Context, ids []string, progress io.Writer) (map[string]string, error) {
	if path := c.String("credentials"); path != "" {
		return readSecretsFile(path, ids)
	}
	if !c.IsSet("store") {
		return nil, nil
	}
	s, err := openStore(c, false)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	begin := time.Now()
	out, err := credential.AddSimulatedMany(c.Context, s, ids)
	if errors.Is(err, credential.ErrNotSimulated) {
		return nil, fmt.Errorf("--id-prefix: %w: it may be a real device's; give another --id-prefix, or --credentials", err)
	}
	if err != nil {
		return nil, fmt.Errorf("--store: credentials of the simulated devices: %w", err)
	}
	fmt.Fprintf(progress, "credentials: %d made in the store in %s\n", len(out), time.Since(begin).Round(10*time.Millisecond))
	return out, nil
}

// readSecretsFile reads lines ID:SECRET (the plain form mosquitto_passwd -U
// hashes); blank lines and lines starting with # are skipped. Every id in
// ids must be there.
func readSecretsFile(path string, ids []string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--credentials: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ':')
		if i <= 0 || i == len(line)-1 {
			return nil, fmt.Errorf("--credentials: %s line %d: want ID:SECRET", path, n)
		}
		id, secret := line[:i], line[i+1:]
		if err := mqttdev.ValidateID("device", id); err != nil {
			return nil, fmt.Errorf("--credentials: %s line %d: %w", path, n, err)
		}
		out[id] = secret
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--credentials: %w", err)
	}
	for _, id := range ids {
		if _, ok := out[id]; !ok {
			return nil, fmt.Errorf("--credentials: %s has no line for device %s", path, id)
		}
	}
	return out, nil
}
