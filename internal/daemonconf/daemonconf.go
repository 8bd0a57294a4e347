// Package daemonconf gives a command a configuration file: a TOML file
// whose keys are the command's flag names (without the dashes) and whose
// values become those flags' values, unless the same flag was given on
// the command line, which wins.
//
// It is generic over a cobra command's flags, so every daemon (meta,
// node, mount, the NFS gateway, up) gets the same file format without
// a struct of its own to keep in step with its flags. A key that names
// no flag, a value of the wrong type, a duplicate key or a table is an
// error naming the key, the file and the line: a typo must not be
// silently ignored by a daemon that then runs with a default.
package daemonconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flag is the name of the flag Add adds.
const Flag = "config"

// SecretAnnotation marks a flag whose value is a secret (a join token):
// a file setting it must not be readable by other users.
const SecretAnnotation = "sluice-secret"

// MaxFileBytes bounds a configuration file: it is a page of settings.
const MaxFileBytes = 1 << 20

// skip are flags a file cannot set: the file itself, and those that do
// not configure the daemon.
var skip = map[string]bool{Flag: true, "help": true, "version": true}

// Add adds --config FILE to cmd. The root command's pre-run calls
// LoadFor before it checks any flag, so values from the file are checked
// as the command line's are.
func Add(cmd *cobra.Command) {
	cmd.Flags().String(Flag, "", "read flag values from this TOML file (keys are flag names; flags on the command line win; docs/config.md)")
}

// LoadFor applies the file cmd's --config names, if cmd has the flag and
// it was given.
func LoadFor(cmd *cobra.Command) error {
	f := cmd.Flags().Lookup(Flag)
	if f == nil || f.Value.String() == "" {
		return nil
	}
	return Load(cmd.Flags(), f.Value.String())
}

// fromFile marks a flag a configuration file set.
const fromFile = "sluice-from-config"

// Given says whether the operator gave flag name, on the command line
// or in the configuration file; checks that apply only to values given
// explicitly use it, not Changed.
func Given(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	_, file := f.Annotations[fromFile]
	return f.Changed || file
}

// Load reads the file at path and applies it to fs (Apply).
func Load(fs *pflag.FlagSet, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("config file %s: not a regular file", path)
	}
	if uid, ok := owner(st); ok && uid != 0 && uid != uint32(os.Getuid()) {
		// Its owner can point the daemon anywhere, as ssh reasons.
		return fmt.Errorf("config file %s: owned by uid %d, neither root nor this user", path, uid)
	}
	if st.Mode().Perm()&0o022 != 0 {
		// Whoever can write it can point the daemon anywhere.
		return fmt.Errorf("config file %s: writable by other users (mode %04o): chmod go-w it", path, st.Mode().Perm())
	}
	data, err := readBounded(f)
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return Apply(fs, path, data, st.Mode().Perm()&0o044 != 0)
}

func readBounded(f *os.File) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

// Apply sets the flags of fs that data (TOML, read from name) gives and
// the command line did not (a flag's Changed). readable says whether
// other users can read the file: then it may set no secret flag.
// Nothing is set unless the whole file is valid.
func Apply(fs *pflag.FlagSet, name string, data []byte, readable bool) error {
	var flags []*pflag.Flag
	var fields []reflect.StructField
	fs.VisitAll(func(f *pflag.Flag) {
		if skip[f.Name] {
			return
		}
		flags = append(flags, f)
		fields = append(fields, reflect.StructField{
			Name: "F" + strconv.Itoa(len(fields)),
			Type: reflect.PointerTo(goType(f)),
			Tag:  reflect.StructTag(`toml:"` + f.Name + `"`),
		})
	})
	v := reflect.New(reflect.StructOf(fields))
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(v.Interface()); err != nil {
		return decodeError(name, data, fs, err)
	}
	for i, f := range flags {
		fv := v.Elem().Field(i)
		if fv.IsNil() {
			continue
		}
		if _, secret := f.Annotations[SecretAnnotation]; secret && readable {
			return fmt.Errorf("config file %s:%d: key %q is a secret, but other users can read the file: chmod go-r it", name, lineOf(data, f.Name), f.Name)
		}
		if f.Changed {
			continue // the command line wins
		}
		// Value.Set, not FlagSet.Set: Changed keeps meaning "given on
		// the command line" (Given covers both). A command that fails
		// here exits, so a file applied in part does no harm.
		if err := set(f, fv.Elem()); err != nil {
			return fmt.Errorf("config file %s:%d: key %q must be %s: %v", name, lineOf(data, f.Name), f.Name, what(f), err)
		}
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[fromFile] = []string{name}
	}
	return nil
}

// goType is the Go type a flag's value decodes into from TOML.
func goType(f *pflag.Flag) reflect.Type {
	switch f.Value.Type() {
	case "bool":
		return reflect.TypeFor[bool]()
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "count":
		return reflect.TypeFor[int64]()
	case "float32", "float64":
		return reflect.TypeFor[float64]()
	}
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return reflect.TypeFor[[]string]()
	}
	return reflect.TypeFor[string]() // strings, durations ("30s"), sizes
}

// what says what a flag's value must be, for errors.
func what(f *pflag.Flag) string {
	switch t := goType(f); {
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int64:
		return "an integer"
	case t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice:
		return `an array of strings, such as ["a", "b"]`
	case f.Value.Type() == "duration":
		return `a duration string, such as "30s"`
	}
	return "a string"
}

// set sets f from a decoded value.
func set(f *pflag.Flag, v reflect.Value) error {
	switch v.Kind() {
	case reflect.Slice:
		return f.Value.(pflag.SliceValue).Replace(v.Interface().([]string))
	case reflect.Bool:
		return f.Value.Set(strconv.FormatBool(v.Bool()))
	case reflect.Int64:
		return f.Value.Set(strconv.FormatInt(v.Int(), 10))
	case reflect.Float64:
		return f.Value.Set(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	}
	return f.Value.Set(v.String())
}

// decodeError names the key and line of a decoding error.
func decodeError(name string, data []byte, fs *pflag.FlagSet, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		e := &strict.Errors[0]
		row, _ := e.Position()
		key := strings.Join(e.Key(), ".")
		if skip[key] && fs.Lookup(key) != nil {
			return fmt.Errorf("config file %s:%d: key %q cannot be set in a config file", name, row, key)
		}
		return fmt.Errorf("config file %s:%d: unknown key %q: this command has no --%s flag", name, row, key, key)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		key := strings.Join(de.Key(), ".")
		if f := fs.Lookup(key); f != nil && !skip[key] {
			return fmt.Errorf("config file %s:%d: key %q must be %s", name, row, key, what(f))
		}
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if key != "" {
			return fmt.Errorf("config file %s:%d: key %q: %s", name, row, key, msg)
		}
		return fmt.Errorf("config file %s:%d: %s", name, row, msg)
	}
	return fmt.Errorf("config file %s: %w", name, err)
}

// lineOf is the line that sets key (for messages about a value the
// decoder accepted): the first whose text starts with the key and "=".
func lineOf(data []byte, key string) int {
	for i, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		for _, q := range []string{"", `"`, "'"} {
			if rest, ok := strings.CutPrefix(l, q+key+q); ok && strings.HasPrefix(strings.TrimSpace(rest), "=") {
				return i + 1
			}
		}
	}
	return 0
}
