package app

// Kill stops the broker the way a crash does, for in-process fault tests. It
// returns once the broker is cut off: its etcd client is closed first, so
// its lease is never revoked and ends only when its TTL runs out, and then
// its connections drop at once, with nothing drained, so no answer of it
// reaches a client after Kill returns. The channel delivers the result once
// its copies and storage have stopped too. What a crash leaves behind the
// data dir keeps, so the broker can start again on it. Close after Kill
// does nothing.
func (a *App) Kill() <-chan error {
	done := make(chan error, 1)
	killed := false
	a.closeOnce.Do(func() {
		killed = true
		// Closing the client stops the lease's keep-alives without a
		// revoke; the coordinator's own revoke on its way out then fails
		// on the closed client, as a dead process sends none.
		if a.etcd != nil {
			_ = a.etcd.Close()
		}
		if a.server != nil {
			_ = a.server.Close()
		}
		if a.coordCancel != nil {
			a.coordCancel()
		}
	})
	if !killed {
		done <- a.closeErr
		return done
	}
	go func() {
		// The coordinator is not waited for before the copies stop: its
		// way out tries that revoke, which only ends with its timeout,
		// and a dead process keeps no copy running.
		if a.manager != nil {
			a.manager.Close()
		}
		var err error
		if a.db != nil {
			err = a.db.Close()
		}
		if a.coordCancel != nil {
			<-a.coordDone
		}
		a.log.Info().Msg("broker killed")
		done <- err
	}()
	return done
}
