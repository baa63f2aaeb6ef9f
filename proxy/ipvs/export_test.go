package ipvs

// SyncGlue is syncGlue for the external tests.
func (b *Backend) SyncGlue(d *Desired) (int, error) { return b.syncGlue(d) }
