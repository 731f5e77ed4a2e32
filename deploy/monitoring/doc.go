// Package monitoring carries kvroute's Grafana dashboard
// (grafana-dashboard.json, in this directory beside the alerts' rule file)
// into the binary, so `kvroute verify` checks a fleet serves what the
// dashboard reads without a list that could drift from it.
//
// Contract:
//   - DashboardSeries reads a dashboard's JSON and returns, by component,
//     the kvroute series its queries select: every "expr" string anywhere
//     in the document (the panels' targets, rows' nested panels), each
//     kvroute_<component>_… name in it once, sorted. Components are
//     picker, sidecar and gossip (gossip's series come from any process
//     that gossips). A histogram's series are read as queried (…_bucket).
//     JSON that does not decode, or a dashboard with no kvroute series, is
//     an error.
//   - Series is DashboardSeries of grafana-dashboard.json, embedded at
//     build time. The deploy package's tests
//     check it equals what Prometheus's own PromQL parser finds in the
//     dashboard's queries.
//   - No I/O: the file is read at build time; nothing here is mutable.
package monitoring
