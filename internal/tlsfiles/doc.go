// Package tlsfiles builds the TLS configurations of groupkv's ports and
// clients from PEM files: a server's certificate and key, and the CA
// certificates it trusts.
//
// A certificate and key are read again when either file changes (looked
// at, at most once a second, by the handshakes that use them), so that a
// renewed certificate is served without a restart; a pair that does not
// load (half-written, mismatched) leaves the last good one in use. A
// port's CA file and its certificate revocation list are read again the
// same way, and a port that asks for certificates verifies each chain
// itself, at the handshake, against them as they are then: a CA added or
// removed, or a certificate revoked, takes effect without a restart.
//
//	srv, err := tlsfiles.Server("node.crt", "node.key", "", "") // TLS, no client certificates
//	peer, err := tlsfiles.Peer("peer.crt", "peer.key", "ca.crt", "ca.crl")
//	dial := tlsfiles.DialConfig(peer, "10.0.0.2") // a node dials another
//	cli, err := tlsfiles.Client("ca.crt", "", "")
//
// It also makes the files (certs.go, behind groupkv certs): a CA,
// certificates it signs for nodes and clients, each good for both ends of
// a connection, and its revocation list.
package tlsfiles
