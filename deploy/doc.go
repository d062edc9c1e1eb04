// Package deploy holds no code: its directory carries what runs Sluice
// elsewhere, and the tests that check it against the binary.
//
//   - prometheus/: recording and alerting rules; grafana/: the dashboard.
//     The test checks every metric they use against those Sluice
//     registers, and runs promtool on the rules when it is installed.
//   - compose/: Sluice behind Envoy in front of a sample upstream, with
//     Redis, Prometheus and Grafana (docker compose).
//   - kubernetes/: a Deployment, Services, a PodDisruptionBudget, a
//     HorizontalPodAutoscaler, a ServiceMonitor and a ConfigMap
//     (kubectl apply -k).
//
// The tests build cmd/sluice and check the flags and SLUICE_* variables
// that the Dockerfile, the compose file and the manifests pass against
// `sluice serve --help`, their ports against the addresses it listens on,
// their configurations with `sluice config validate`, and the Deployment's
// probes against a running sluice; they run docker compose config, kubectl
// kustomize, kubeconform, promtool and goreleaser check where installed,
// and say which they skipped. See docs/deploy.md.
package deploy
