//go:build race

package policy

// raceEnabled reports a build with the race detector, which makes
// yaml.v3 some twenty times slower.
const raceEnabled = true
