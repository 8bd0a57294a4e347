package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// withClient runs fn with a client and closes it.
func (a *app) withClient(fn func(c *sdk.Client) error, tune ...func(*sdk.Options)) error {
	c, err := a.client(tune...)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

func (a *app) putCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "put LOCAL REMOTE",
		Short: "Store a local file (or stdin with -) at REMOTE; into REMOTE if it is a directory",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, remote := args[0], args[1]
			return a.withClient(func(c *sdk.Client) error {
				ctx := cmd.Context()
				var in io.Reader = os.Stdin
				mode := uint32(0o644)
				if local != "-" {
					f, err := os.Open(local)
					if err != nil {
						return err
					}
					defer f.Close()
					fi, err := f.Stat()
					if err != nil {
						return err
					}
					if fi.IsDir() {
						return fmt.Errorf("%s is a directory", local)
					}
					mode = uint32(fi.Mode().Perm())
					in = f
				}
				if strings.HasSuffix(remote, "/") {
					if _, err := c.Stat(ctx, remote); err != nil {
						return err // missing, or not a directory
					}
					if local == "-" {
						return errors.New("put from stdin needs a file name, not a directory")
					}
					remote = path.Join(remote, filepath.Base(local))
				} else if at, err := c.Stat(ctx, remote); err == nil && at.Type == metaapi.TypeDir {
					if local == "-" {
						return fmt.Errorf("%s is a directory; put from stdin needs a file name", remote)
					}
					remote = path.Join(remote, filepath.Base(local))
				}
				_, err := c.Put(ctx, remote, in, mode)
				return err
			})
		},
	}
}

func (a *app) getCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get REMOTE LOCAL",
		Short: "Copy REMOTE to a local file (or stdout with -)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			remote, local := args[0], args[1]
			return a.withClient(func(c *sdk.Client) error {
				if local == "-" {
					_, err := c.Get(cmd.Context(), remote, a.stdout)
					return err
				}
				if fi, err := os.Stat(local); err == nil && fi.IsDir() {
					local = filepath.Join(local, path.Base(remote))
				} else if err == nil && !fi.Mode().IsRegular() {
					// A device or FIFO (/dev/null, a pipe) is written
					// to, never replaced by a renamed file.
					f, err := os.OpenFile(local, os.O_WRONLY, 0)
					if err != nil {
						return err
					}
					if _, err := c.Get(cmd.Context(), remote, f); err != nil {
						f.Close()
						return err
					}
					return f.Close()
				}
				// Write beside the target and rename, so a failed get
				// never leaves a truncated file under the real name.
				tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".sluice-get-*")
				if err != nil {
					return err
				}
				defer os.Remove(tmp.Name())
				if _, err := c.Get(cmd.Context(), remote, tmp); err != nil {
					tmp.Close()
					return err
				}
				if err := tmp.Close(); err != nil {
					return err
				}
				return os.Rename(tmp.Name(), local)
			})
		},
	}
}

func (a *app) catCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat REMOTE...",
		Short: "Write files to stdout",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				for _, p := range args {
					if _, err := c.Get(cmd.Context(), p, a.stdout); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

func (a *app) lsCmd() *cobra.Command {
	var long, raw bool
	cmd := &cobra.Command{
		Use:   "ls [PATH]",
		Short: "List a directory",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := "/"
			if len(args) == 1 {
				p = args[0]
			}
			return a.withClient(func(c *sdk.Client) error {
				ctx := cmd.Context()
				at, err := c.Stat(ctx, p)
				if err != nil {
					return err
				}
				if at.Type != metaapi.TypeDir {
					printEntries(a.stdout, long, raw, []entry{{path.Base(p), at}})
					return nil
				}
				ents, err := c.ReadDir(ctx, p)
				if err != nil {
					return err
				}
				out := make([]entry, 0, len(ents))
				for _, e := range ents {
					var at metaapi.Attr
					if long {
						if at, err = c.Lstat(ctx, path.Join(p, string(e.Name))); err != nil {
							if sdk.IsNotExist(err) {
								continue // removed meanwhile
							}
							return err
						}
					} else {
						at.Type = e.Type
					}
					out = append(out, entry{string(e.Name), at})
				}
				printEntries(a.stdout, long, raw, out)
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "long listing: type, mode, owner, size, mtime")
	cmd.Flags().BoolVarP(&raw, "null", "0", false, "print names as they are (bytes, unquoted), each line ending in NUL instead of newline")
	return cmd
}

type entry struct {
	name string
	attr metaapi.Attr
}

// printEntries lists ents, a name a line: names not printable UTF-8
// quoted as displayName says, or with raw each as it is and each line
// ending in NUL (a name holds any byte but NUL and '/').
func printEntries(w io.Writer, long, raw bool, ents []entry) {
	show, end := displayName, "\n"
	if raw {
		show, end = func(s string) string { return s }, "\x00"
	}
	if !long {
		for _, e := range ents {
			name := show(e.name)
			if e.attr.Type == metaapi.TypeDir {
				name += "/"
			}
			io.WriteString(w, name+end)
		}
		return
	}
	// Only the columns before the name are aligned: a raw name's tabs
	// and newlines are no business of the tab writer.
	var cols bytes.Buffer
	tw := tabwriter.NewWriter(&cols, 0, 0, 1, ' ', tabwriter.AlignRight)
	for _, e := range ents {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t\n", modeString(e.attr), e.attr.UID, e.attr.GID, e.attr.Size,
			time.Unix(0, e.attr.Mtime).Format("2006-01-02 15:04"))
	}
	tw.Flush()
	for _, e := range ents {
		line, _ := cols.ReadString('\n')
		name := show(e.name)
		if e.attr.Type == metaapi.TypeSymlink {
			name += " -> " + show(string(e.attr.Target))
		}
		io.WriteString(w, strings.TrimSuffix(line, "\n")+" "+name+end)
	}
}

func modeString(a metaapi.Attr) string {
	t := map[metaapi.FileType]byte{metaapi.TypeDir: 'd', metaapi.TypeSymlink: 'l', metaapi.TypeFIFO: 'p',
		metaapi.TypeSocket: 's', metaapi.TypeBlock: 'b', metaapi.TypeChar: 'c'}[a.Type]
	if t == 0 {
		t = '-'
	}
	b := []byte{t}
	const rwx = "rwxrwxrwx"
	for i := 0; i < 9; i++ {
		if a.Mode&(1<<(8-i)) != 0 {
			b = append(b, rwx[i])
		} else {
			b = append(b, '-')
		}
	}
	return string(b)
}

func (a *app) statCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat PATH",
		Short: "Show a file's attributes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				at, err := c.Lstat(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(at)
				}
				fmt.Fprintf(a.stdout, "  File: %s\n  Type: %s\n  Size: %d\n Inode: %d\n Links: %d\n  Mode: %04o (%s)\n   Uid: %d\n   Gid: %d\nModify: %s\nChange: %s\n",
					displayName(args[0]), at.Type, at.Size, at.Ino, at.Nlink, at.Mode, modeString(at), at.UID, at.GID,
					time.Unix(0, at.Mtime).Format(time.RFC3339Nano), time.Unix(0, at.Ctime).Format(time.RFC3339Nano))
				if at.Policy != nil {
					fmt.Fprintf(a.stdout, "Policy: %s\n", at.Policy)
				}
				if at.Type == metaapi.TypeFile {
					fmt.Fprintf(a.stdout, " Chunk: %d bytes\n", at.ChunkSize)
				}
				if at.Type == metaapi.TypeSymlink {
					fmt.Fprintf(a.stdout, "Target: %s\n", displayName(string(at.Target)))
				}
				if at.Type.IsDevice() {
					fmt.Fprintf(a.stdout, "Device: %d,%d\n", metaapi.DevMajor(at.Rdev), metaapi.DevMinor(at.Rdev))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func (a *app) mkdirCmd() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "mkdir PATH...",
		Short: "Create directories",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				for _, p := range args {
					var err error
					if parents {
						err = c.MkdirAll(cmd.Context(), p, 0o755)
					} else {
						err = c.Mkdir(cmd.Context(), p, 0o755)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "create parents as needed; no error if it exists")
	return cmd
}

func (a *app) rmCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm PATH...",
		Short: "Remove files or empty directories (-r: directories and their contents)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				for _, p := range args {
					var err error
					if recursive {
						err = c.RemoveAll(cmd.Context(), p)
					} else {
						err = c.Remove(cmd.Context(), p)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return cmd
}

func (a *app) mvCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mv OLD NEW",
		Short: "Rename or move (atomically; NEW is replaced if POSIX allows; into NEW if it is a directory)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				dst := args[1]
				if at, err := c.Stat(cmd.Context(), dst); err == nil && at.Type == metaapi.TypeDir {
					if src, err := c.Lstat(cmd.Context(), args[0]); err == nil && src.Ino != at.Ino {
						dst = path.Join(dst, path.Base(args[0]))
					}
				}
				return c.Rename(cmd.Context(), args[0], dst)
			})
		},
	}
}
