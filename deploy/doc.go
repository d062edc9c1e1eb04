// Package deploy holds no code: its directory carries the Prometheus rules
// (prometheus/) and the Grafana dashboard (grafana/) for Sluice, and its
// test checks them against the metrics Sluice registers, and with promtool
// when it is installed.
package deploy
