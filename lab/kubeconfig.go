package lab

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/weftnet/weft/lab/pki"
)

// writeKubeconfig writes a kubeconfig with embedded credentials.
func writeKubeconfig(path, server string, ca *x509.Certificate, pair *pki.Pair) error {
	key, err := pki.KeyPEM(pair.Key)
	if err != nil {
		return err
	}
	b64 := base64.StdEncoding.EncodeToString
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: weft-lab
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: weft-lab
  context:
    cluster: weft-lab
    user: %s
current-context: weft-lab
`, server, b64(pki.CertPEM(ca)), pair.Cert.Subject.CommonName, b64(pki.CertPEM(pair.Cert)), b64(key), pair.Cert.Subject.CommonName)
	return os.WriteFile(path, []byte(doc), 0o600)
}
