// Package gossip wraps hashicorp/memberlist for kvroute: membership,
// failure detection and node metadata for sidecars and pickers (DESIGN.md
// §6). It is not payload-agnostic: it owns kvroute's metadata schema
// (Meta: roles, gRPC address, identity group, models served, endpoint
// digests), its wire form and its validation, so every member encodes and
// checks metadata the same way.
//
// Contract:
//   - Config has DefaultConfig (LAN timings) and LocalConfig (loopback
//     tests); Validate names the flag at fault.
//   - Names are unique by default on one host too: the default NodeName is
//     "<host name>-{role}-{port}", resolved once the port is bound
//     ({port}: the advertised port when set, else the bound one), and the
//     bind port falls back to the next free one of BindPorts (default
//     7946–7961), so sidecars and pickers sharing a host with default
//     settings each bind a port and take a distinct name. A given name
//     without placeholders is used as it is.
//   - A name conflict (another member claiming a name held at another
//     address, which memberlist refuses) is logged once at error level,
//     counted (kvroute_gossip_name_conflicts_total{kind}) and held on a
//     gauge (kvroute_gossip_name_conflict{kind}) until the claimant,
//     contacted every Rejoin, stops renewing it; Conflict reports one
//     that involves this node's own name, for readiness checks.
//   - memberlist's own log lines reach zap at the level they are tagged
//     with ([DEBUG], [INFO], [WARN], [ERR]); its per-message "Conflicting
//     address" line is at debug, the conflict being reported as above.
//   - Join takes host:port entries or DNS names that resolve to several
//     addresses (a headless Service); each address is tried.
//   - Node metadata is a Meta (role, gRPC address, identity group, the
//     models served, and each served endpoint's (epoch, seq) digest),
//     encoded in at most MetaLimit (512) bytes; a node whose metadata does
//     not decode or validate is reported with the error, never trusted.
//     Keys this version does not know are ignored and a key left out reads
//     as its zero value, so members of different versions read each other
//     (a member from before this rule refuses metadata carrying a key it
//     does not know, such as the models, m: upgrade pickers before
//     sidecars past that version).
//   - Models (a sidecar's) are advertised all or none (AdvertisedModels):
//     at most MaxModels names of at most MaxModelLen bytes of printable
//     UTF-8, none twice. None means unknown — an older sidecar, or names
//     that did not fit — and a picker sharded by model dials such a
//     sidecar and asks what it serves, as before models were advertised.
//   - Join, leave and update are delivered as Event values on a buffered
//     channel that never blocks memberlist; a consumer that falls behind
//     loses events (counted) and resynchronises from Members().
//   - Gossip is encrypted with a keyring read from a key file (one base64
//     key a line, the first is primary), held with gossip/secretfile: the
//     file is checked every KeyPoll and an edit applied (keys listed
//     installed, the first made primary, keys no longer listed removed);
//     ReloadKeys applies it at once (SIGHUP). So keys rotate without
//     downtime or signal: add the new key everywhere, make it primary
//     everywhere, then remove the old one. A file that cannot be used
//     keeps the keys in use; reloads and failures are logged and counted
//     as the process's other secrets are (secret="gossip_key" on
//     Config.Secrets).
package gossip
