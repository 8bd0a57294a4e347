package nfsexport

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// The exports(5) syntax: Parse and ParseLine read it strictly, String
// writes the canonical form they read back.

// ---- formatting: the canonical form Parse reads back ----

func (o Options) String() string {
	var b strings.Builder
	if o.ReadWrite {
		b.WriteString("rw")
	} else {
		b.WriteString("ro")
	}
	b.WriteString([...]string{",root_squash", ",no_root_squash", ",all_squash"}[o.Squash])
	if o.Insecure {
		b.WriteString(",insecure")
	} else {
		b.WriteString(",secure")
	}
	fmt.Fprintf(&b, ",anonuid=%d,anongid=%d", o.AnonUID, o.AnonGID)
	return b.String()
}

func (c Client) String() string {
	host := "*"
	if !c.Any {
		host = c.Net.String()
	}
	return host + "(" + c.Opts.String() + ")"
}

// String is e in the syntax Parse reads, every option spelt out.
func (e Export) String() string {
	var b strings.Builder
	b.WriteString(quotePath(e.Path))
	for _, c := range e.Clients {
		b.WriteByte(' ')
		b.WriteString(c.String())
	}
	return b.String()
}

func quotePath(p string) string {
	if strings.ContainsAny(p, " \t#") {
		return `"` + p + `"`
	}
	return p
}

// ---- parsing ----

// ParseLine parses one export: a path, then one or more clients, each
// HOST or HOST(OPTIONS), separated by blanks. HOST is an IPv4 or IPv6
// address, a network in CIDR notation, or * for every address. Host
// names, wildcards and netgroups are refused: they are only as good as
// the name service answering them. A path with blanks is written in
// double quotes.
func ParseLine(line string) (Export, error) {
	toks, err := tokens(line)
	if err != nil {
		return Export{}, err
	}
	if len(toks) == 0 {
		return Export{}, errors.New("empty export")
	}
	p, err := parsePath(toks[0])
	if err != nil {
		return Export{}, err
	}
	if len(toks) == 1 {
		return Export{}, fmt.Errorf("export %s names no clients: give at least one, e.g. %s 10.0.0.0/8(rw) (or * for every address)", quotePath(p), quotePath(p))
	}
	e := Export{Path: p}
	for _, t := range toks[1:] {
		c, err := parseClient(t)
		if err != nil {
			return Export{}, err
		}
		for _, o := range e.Clients {
			if o.Any == c.Any && o.Net == c.Net {
				return Export{}, fmt.Errorf("%q: client %s named twice for %s", t, hostString(c), quotePath(p))
			}
		}
		e.Clients = append(e.Clients, c)
	}
	return e, nil
}

func hostString(c Client) string {
	if c.Any {
		return "*"
	}
	return c.Net.String()
}

// tokens splits a line at blanks, keeping a double-quoted token (the
// path) whole.
func tokens(line string) ([]string, error) {
	var toks []string
	for i := 0; i < len(line); {
		switch line[i] {
		case ' ', '\t':
			i++
			continue
		case '"':
			j := strings.IndexByte(line[i+1:], '"')
			if j < 0 {
				return nil, fmt.Errorf("%q: unterminated quote", line[i:])
			}
			end := i + 1 + j + 1
			if end < len(line) && line[end] != ' ' && line[end] != '\t' {
				return nil, fmt.Errorf("%q: text after the closing quote", line[i:])
			}
			toks = append(toks, line[i:end])
			i = end
			continue
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		toks = append(toks, line[i:j])
		i = j
	}
	return toks, nil
}

func parsePath(t string) (string, error) {
	p := t
	if strings.HasPrefix(t, `"`) {
		p = t[1 : len(t)-1]
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%q: an export path must be absolute (begin with /)", t)
	case strings.ContainsAny(p, "\"\x00\n\r"):
		return "", fmt.Errorf("%q: quotes, NUL and line breaks are not allowed in an export path", t)
	case len(p) > metaapi.MaxPathLen:
		return "", fmt.Errorf("export path of %d bytes: longer than %d", len(p), metaapi.MaxPathLen)
	case path.Clean(p) != p:
		return "", fmt.Errorf("%q: write the export path as %s (no //, . or .. components, no trailing /)", t, path.Clean(p))
	}
	return p, nil
}

// parseClient parses HOST or HOST(OPTIONS).
func parseClient(t string) (Client, error) {
	host, opts, hasOpts := strings.Cut(t, "(")
	if hasOpts {
		if !strings.HasSuffix(opts, ")") || strings.ContainsAny(opts[:len(opts)-1], "()") {
			return Client{}, fmt.Errorf("%q: options go in one pair of parentheses right after the host, e.g. 10.0.0.0/8(rw,root_squash)", t)
		}
		opts = opts[:len(opts)-1]
	} else if strings.Contains(t, ")") {
		return Client{}, fmt.Errorf("%q: unbalanced parenthesis", t)
	}
	var c Client
	switch {
	case host == "":
		return Client{}, fmt.Errorf("%q: options with no host before them (a blank between a host and its options makes them apply to every address in Linux; write HOST(OPTIONS) with no blank, or *(OPTIONS))", t)
	case host == "*":
		c.Any = true
	default:
		n, err := parseHost(host)
		if err != nil {
			return Client{}, fmt.Errorf("%q: %w", t, err)
		}
		c.Net = n
	}
	o, err := parseOptions(opts, hasOpts)
	if err != nil {
		return Client{}, fmt.Errorf("%q: %w", t, err)
	}
	c.Opts = o
	return c, nil
}

// parseHost parses an address or a network in CIDR notation.
func parseHost(h string) (netip.Prefix, error) {
	if strings.HasPrefix(h, "-") {
		return netip.Prefix{}, errors.New("default options (-OPTIONS) are not supported: give each client its options")
	}
	if a, p, ok := strings.Cut(h, "/"); ok {
		if strings.Contains(p, ".") {
			return netip.Prefix{}, fmt.Errorf("give the network's prefix length (%s/24), not a mask", a)
		}
		n, err := netip.ParsePrefix(h)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a network (ADDRESS/BITS): %w", err)
		}
		if n.Addr().Zone() != "" {
			return netip.Prefix{}, errors.New("zones are not allowed in a network")
		}
		if n.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("write an IPv4 network as IPv4 (not %s)", h)
		}
		if m := n.Masked(); m != n {
			return netip.Prefix{}, fmt.Errorf("address bits set past the prefix length: did you mean %s?", m)
		}
		return n, nil
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Prefix{}, errors.New("not an IP address, network or *: host names, wildcards and @netgroups are not supported (they are only as trustworthy as the name service)")
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errors.New("zones are not allowed in an address")
	}
	if a.Is4In6() {
		return netip.Prefix{}, fmt.Errorf("write an IPv4 address as IPv4 (%s)", a.Unmap())
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseOptions parses a comma-separated option list. Each option may be
// given once; contradictory ones (ro and rw, ...) are refused.
func parseOptions(s string, given bool) (Options, error) {
	o := DefaultOptions()
	if !given {
		return o, nil
	}
	if s == "" {
		return o, errors.New("empty option list: drop the parentheses for the defaults (ro,root_squash,secure)")
	}
	seen := map[string]string{} // option group -> the option that set it
	all := false
	set := func(group, opt string) error {
		if prev, ok := seen[group]; ok {
			if prev == opt {
				return fmt.Errorf("option %q given twice", opt)
			}
			return fmt.Errorf("options %q and %q contradict each other", prev, opt)
		}
		seen[group] = opt
		return nil
	}
	for _, opt := range strings.Split(s, ",") {
		var err error
		switch opt {
		case "":
			err = errors.New("empty option (two commas, or a comma at an end)")
		case "rw", "ro":
			err = set("rw", opt)
			o.ReadWrite = opt == "rw"
		case "root_squash", "no_root_squash":
			err = set("root", opt)
			if opt == "no_root_squash" {
				o.Squash = NoRootSquash
			}
		case "all_squash", "no_all_squash":
			err = set("all", opt)
			all = opt == "all_squash"
		case "secure", "insecure":
			err = set("secure", opt)
			o.Insecure = opt == "insecure"
		case "sync", "subtree_check":
			// What the gateway always does: every WRITE is durable when
			// answered, and every file handle is checked to lie in its
			// export.
			err = set(opt, opt)
		case "async":
			err = errors.New(`option "async" is not supported: the gateway answers every WRITE once it is durable (sync)`)
		case "no_subtree_check":
			err = errors.New(`option "no_subtree_check" is not supported: the gateway always checks that a file handle belongs to its export (subtree_check)`)
		default:
			name, val, isKV := strings.Cut(opt, "=")
			if isKV && (name == "anonuid" || name == "anongid") {
				if err = set(name, name); err != nil {
					break
				}
				var n uint64
				n, err = strconv.ParseUint(val, 10, 32)
				if err != nil || n == 1<<32-1 || val != strconv.FormatUint(n, 10) {
					err = fmt.Errorf("option %q: %s must be a number from 0 to 4294967294", opt, name)
					break
				}
				if name == "anonuid" {
					o.AnonUID = uint32(n)
				} else {
					o.AnonGID = uint32(n)
				}
				break
			}
			err = fmt.Errorf("unknown option %q (known: ro, rw, root_squash, no_root_squash, all_squash, no_all_squash, secure, insecure, anonuid=N, anongid=N, sync, subtree_check)", opt)
		}
		if err != nil {
			return o, err
		}
	}
	if all {
		// all_squash covers root: no_root_squash beside it would read
		// as a promise it does not keep.
		if seen["root"] == "no_root_squash" {
			return o, errors.New(`options "no_root_squash" and "all_squash" contradict each other`)
		}
		o.Squash = AllSquash
	}
	return o, nil
}

// Parse reads an exports file: one export per line, blank lines and
// comments (from a # at the start of a line or after a blank) ignored,
// and a line ending in \ continued on the next. Errors name the file
// and line. An export path may appear once.
func Parse(name, text string) ([]Export, error) {
	var out []Export
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := stripComment(lines[i])
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = line[:len(line)-1] + " " + stripComment(lines[i])
		}
		if strings.HasSuffix(line, `\`) {
			return nil, fmt.Errorf("%s:%d: the last line ends in \\", name, start)
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, err := ParseLine(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, start, err)
		}
		if out, err = Add(out, e); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, start, err)
		}
	}
	return out, nil
}

// Add appends e to exports, refusing a path exported twice.
func Add(exports []Export, e Export) ([]Export, error) {
	for _, o := range exports {
		if o.Path == e.Path {
			return nil, fmt.Errorf("%s is exported twice: give all its clients on one line", quotePath(e.Path))
		}
	}
	return append(exports, e), nil
}

// stripComment drops a comment: from a # at the start of the line or
// after a blank, outside double quotes; a trailing \r (CRLF files) too.
func stripComment(line string) string {
	line = strings.TrimRight(line, " \t\r")
	quoted := false
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '"':
			quoted = !quoted
		case line[i] == '#' && !quoted && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimRight(line[:i], " \t")
		}
	}
	return line
}
