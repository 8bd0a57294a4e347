package main

import (
	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/readyfile"
)

// addReadyFlag gives a daemon --ready-file: the file programs that start
// it (internal/launch) wait on, instead of parsing its messages.
func addReadyFlag(cmd *cobra.Command, path *string) {
	cmd.Flags().StringVar(path, "ready-file", "", "once serving, write this file (JSON: addresses, node ids, the client config's path) for programs that start the daemon")
}

// writeReady writes the ready file if one was asked for.
func writeReady(path string, info readyfile.Info) error {
	if path == "" {
		return nil
	}
	return readyfile.Write(path, info)
}
