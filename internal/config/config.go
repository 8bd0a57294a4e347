// Package config reads and writes client.conf, the file a client needs to
// reach and authenticate to a cluster: the meta address and one
// principal's id and credential. It is JSON so other tools can read it;
// it is written with mode 0600 because it grants what the principal may do.
package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ClientConf is the content of client.conf.
type ClientConf struct {
	Meta       string `json:"meta"`       // meta service address, host:port
	ClientID   uint64 `json:"client_id"`  // the principal's id
	Credential string `json:"credential"` // the principal's secret credential (hex)
	Principal  string `json:"principal,omitempty"`
}

// EnvConf is the environment variable naming client.conf.
const EnvConf = "SLUICE_CONF"

// DefaultPath is where clients look when neither --conf nor $SLUICE_CONF is set.
const DefaultPath = "sluice-data/client.conf"

// FileName is client.conf's name inside a data directory.
const FileName = "client.conf"

// UserPath is where a user keeps their own principal's client.conf:
// $XDG_CONFIG_HOME/sluice/client.conf, else ~/.config/sluice/client.conf
// ("" if there is no home directory).
func UserPath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "sluice", FileName)
}

// Find returns the path to use: flag, else $SLUICE_CONF, else the user's
// own (UserPath) if it exists, else DefaultPath.
func Find(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(EnvConf); env != "" {
		return env
	}
	if p := UserPath(); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return DefaultPath
}

// Load reads and checks a client.conf.
func Load(path string) (ClientConf, error) {
	var c ClientConf
	raw, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading client config (set --conf or $%s): %w", EnvConf, err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("parsing client config %s: %w", path, err)
	}
	if c.Meta == "" || c.Credential == "" {
		return c, fmt.Errorf("client config %s: missing meta address or credential", path)
	}
	return c, nil
}

// Save writes c to path atomically with mode 0600.
func Save(path string, c ClientConf) error {
	raw, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".client.conf.*")
	if err != nil {
		return fmt.Errorf("writing client config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing client config: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing client config: %w", err)
	}
	return nil
}
