// Package tlsfiles builds the TLS configurations of groupkv's ports and
// clients from PEM files: a server's certificate and key, and the CA
// certificates it trusts.
//
// A certificate and key are read again when either file changes (looked
// at, at most once a second, by the handshakes that use them), so that a
// renewed certificate is served without a restart; a pair that does not
// load (half-written, mismatched) leaves the last good one in use. CA files
// are read once.
//
//	srv, err := tlsfiles.Server("node.crt", "node.key", "") // TLS, no client certificates
//	peer, err := tlsfiles.Peer("peer.crt", "peer.key", "ca.crt")
//	cli, err := tlsfiles.Client("ca.crt", "", "")
//
// It also makes the files (certs.go, behind groupkv certs): a CA, and
// certificates it signs for nodes and clients, each good for both ends of
// a connection.
package tlsfiles
