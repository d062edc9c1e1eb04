package client

// SetMaxAnswer sets the bound on an answer's size until the function it
// returns is called.
func SetMaxAnswer(n int64) (restore func()) {
	old := maxAnswer
	maxAnswer = n
	return func() { maxAnswer = old }
}
