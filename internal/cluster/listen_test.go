package cluster

import "testing"

func TestNodeListenAddr(t *testing.T) {
	for _, tc := range []struct {
		spec string
		i    int
		want string
	}{
		{"", 1, "127.0.0.1:0"},
		{"127.0.0.2", 3, "127.0.0.2:0"},
		{"0.0.0.0", 1, "0.0.0.0:0"},
		{"::1", 2, "[::1]:0"},
		{"[::1]", 2, "[::1]:0"},
		{"10.0.0.5:7701", 1, "10.0.0.5:7701"},
		{"10.0.0.5:7701", 4, "10.0.0.5:7704"},
		{"[fd00::1]:7701", 2, "[fd00::1]:7702"},
		{"node.example:0", 2, "node.example:0"},
		{"10.0.0.5:65535", 2, ""},
		{"10.0.0.5:x", 1, ""},
		{":7701", 1, ""},
		{"a b", 1, ""},
	} {
		got, err := NodeListenAddr(tc.spec, tc.i)
		if tc.want == "" {
			if err == nil {
				t.Errorf("NodeListenAddr(%q, %d) = %q, want an error", tc.spec, tc.i, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NodeListenAddr(%q, %d) = %q, %v; want %q", tc.spec, tc.i, got, err, tc.want)
		}
	}
}
