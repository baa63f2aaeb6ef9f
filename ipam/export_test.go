package ipam

// SetBootIDFile makes the stores read the boot ID from path until the
// returned function restores the kernel's.
func SetBootIDFile(path string) (restore func()) {
	old := bootIDFile
	bootIDFile = path
	return func() { bootIDFile = old }
}
