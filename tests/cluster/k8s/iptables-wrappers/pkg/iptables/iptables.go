/*
Copyright 2014 The Kubernetes Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package iptables is the part of Kubernetes 1.37's pkg/util/iptables that the 1.38
// kubelet calls, with 1.38's context-first signatures (../../README.md says why it is
// here). It runs the installed iptables binaries, as 1.37 did.
package iptables

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Mode chooses between iptables-legacy and iptables-nft; UseInstalledMode runs whatever
// `iptables` is installed, the only mode this package has.
type Mode string

// UseInstalledMode runs the installed `iptables` and `ip6tables`.
const UseInstalledMode Mode = "installed"

// RulePosition is -I (Prepend) or -A (Append).
type RulePosition string

const (
	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"
)

// Protocol is IPv4 or IPv6.
type Protocol string

const (
	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
)

// Table is an iptables table.
type Table string

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"
)

// Chain is an iptables chain.
type Chain string

const (
	ChainPostrouting Chain = "POSTROUTING"
	ChainPrerouting  Chain = "PREROUTING"
	ChainOutput      Chain = "OUTPUT"
	ChainInput       Chain = "INPUT"
	ChainForward     Chain = "FORWARD"
)

// Interface is what the kubelet uses.
type Interface interface {
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	ChainExists(ctx context.Context, table Table, chain Chain) (bool, error)
	DeleteChain(ctx context.Context, table Table, chain Chain) error
	IsIPv6() bool
	Protocol() Protocol
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
	Present(ctx context.Context) error
}

type runner struct {
	protocol Protocol
}

// New returns an Interface that runs the installed iptables for protocol.
func New(protocol Protocol) Interface { return &runner{protocol: protocol} }

// NewBestEffort returns an Interface per IP family whose iptables works here (none when
// iptables is missing: not an error for the kubelet).
func NewBestEffort(ctx context.Context, _ Mode) map[v1.IPFamily]Interface {
	out := map[v1.IPFamily]Interface{}
	if r := New(ProtocolIPv4); r.Present(ctx) == nil {
		out[v1.IPv4Protocol] = r
	}
	if r := New(ProtocolIPv6); r.Present(ctx) == nil {
		out[v1.IPv6Protocol] = r
	}
	return out
}

func (r *runner) command() string {
	if r.protocol == ProtocolIPv6 {
		return "ip6tables"
	}
	return "iptables"
}

func (r *runner) run(ctx context.Context, op string, table Table, chain Chain, args ...string) ([]byte, error) {
	full := append([]string{"-w", "5", op, string(chain), "-t", string(table)}, args...)
	klog.FromContext(ctx).V(5).Info("Running", "command", r.command(), "arguments", full)
	return exec.CommandContext(ctx, r.command(), full...).CombinedOutput()
}

// exitedWith1: iptables exits 1 when the operation failed (the chain exists, the rule
// does not), as opposed to a bad command line.
func exitedWith1(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 1
}

func (r *runner) EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error) {
	out, err := r.run(ctx, "-N", table, chain)
	if err != nil {
		if exitedWith1(err) {
			return true, nil
		}
		return false, fmt.Errorf("error creating chain %q: %v: %s", chain, err, out)
	}
	return false, nil
}

func (r *runner) EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error) {
	out, err := r.run(ctx, "-C", table, chain, args...)
	if err == nil {
		return true, nil
	}
	if !exitedWith1(err) {
		return false, fmt.Errorf("error checking rule: %v: %s", err, out)
	}
	if out, err := r.run(ctx, string(position), table, chain, args...); err != nil {
		return false, fmt.Errorf("error appending rule: %v: %s", err, out)
	}
	return false, nil
}

func (r *runner) ChainExists(ctx context.Context, table Table, chain Chain) (bool, error) {
	out, err := r.run(ctx, "-S", table, chain)
	if err != nil {
		return false, fmt.Errorf("error listing chain %q in table %q: %w: %s", chain, table, err, out)
	}
	return true, nil
}

func (r *runner) DeleteChain(ctx context.Context, table Table, chain Chain) error {
	out, err := r.run(ctx, "-X", table, chain)
	if err != nil && !exitedWith1(err) {
		return fmt.Errorf("error deleting chain %q: %v: %s", chain, err, out)
	}
	return nil
}

func (r *runner) IsIPv6() bool       { return r.protocol == ProtocolIPv6 }
func (r *runner) Protocol() Protocol { return r.protocol }

// Present: iptables works if the nat table's POSTROUTING chain can be listed.
func (r *runner) Present(ctx context.Context) error {
	_, err := r.ChainExists(ctx, TableNAT, ChainPostrouting)
	return err
}

// Monitor creates the canary chain in each table, then polls every interval; when the
// first table's canary is gone (someone flushed iptables) it calls reloadFunc and starts
// over, until ctx is done (then it deletes its canaries), as 1.37's Monitor did.
func (r *runner) Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	created := false
	for {
		if !created {
			created = true
			for _, t := range tables {
				if _, err := r.EnsureChain(ctx, t, canary); err != nil {
					logger.Error(err, "Could not set up iptables canary", "table", t, "chain", canary)
					created = false
				}
			}
		} else if exists, _ := r.ChainExists(ctx, tables[0], canary); !exists && ctx.Err() == nil {
			logger.V(2).Info("IPTables canary deleted; reloading", "table", tables[0], "chain", canary)
			reloadFunc()
			created = false
			continue
		}
		select {
		case <-ctx.Done():
			cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for _, t := range tables {
				_ = r.DeleteChain(cleanup, t, canary)
			}
			cancel()
			return
		case <-tick.C:
		}
	}
}
