package main
import "github.com/urfave/cli/v2"
func benchCommand() *cli.Command { return &cli.Command{Name: "bench"} }
