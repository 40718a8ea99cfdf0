package app

// Kill stops the broker the way a crash does, for in-process fault tests:
// its etcd client goes first, so its lease is never revoked and ends only
// when its TTL runs out, and its connections drop at once, with nothing
// drained. What a crash leaves behind the data dir keeps, so the broker can
// start again on it. Close after Kill does nothing.
func (a *App) Kill() error {
	a.closeOnce.Do(func() {
		// Closing the client stops the lease's keep-alives without a
		// revoke; the coordinator's own revoke on its way out then fails
		// on the closed client, as a dead process sends none.
		if a.etcd != nil {
			_ = a.etcd.Close()
		}
		if a.server != nil {
			_ = a.server.Close()
		}
		// The coordinator is not waited for before the copies stop: its
		// way out tries a revoke on the closed client, which only ends
		// with its timeout, and a dead process keeps no copy running.
		if a.coordCancel != nil {
			a.coordCancel()
		}
		if a.manager != nil {
			a.manager.Close()
		}
		if a.db != nil {
			a.closeErr = a.db.Close()
		}
		if a.coordCancel != nil {
			<-a.coordDone
		}
		a.log.Info().Msg("broker killed")
	})
	return a.closeErr
}
