#!/usr/bin/env bash
# Regenerates the DEVELOPMENT-ONLY certificates in this folder:
#   ca.pem / ca.key          a self-signed dev CA
#   server.pem / server.key  server cert for localhost, 127.0.0.1 and ::1, signed by the CA
#   client.pem / client.key  client cert (CN=postbox-dev-client) for mutual-TLS tests
#   sensor1.pem / .key,      device certs (CN=sensor1, CN=sensor2, clientAuth) for the
#   sensor2.pem / .key       CN-as-username tests
# Files that exist are kept (so adding a certificate does not invalidate the others);
# `gen.sh --all` regenerates everything, CA included.
# Keys are ECDSA P-256 in PKCS#8 PEM. Everything is valid for 10 years so tests do not rot.
# The private keys are committed on purpose: never use these files in production.
set -euo pipefail

command -v openssl >/dev/null || { echo "gen.sh: openssl not found (apt-get install -y openssl)" >&2; exit 1; }
cd "$(dirname "$0")"

DAYS=3650
force=false
[ "${1:-}" = "--all" ] && force=true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

# --- CA ---------------------------------------------------------------------------------------
if $force || [ ! -f ca.pem ] || [ ! -f ca.key ]; then
force=true   # a new CA invalidates every leaf
key ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$DAYS" \
    -subj "/O=Postbox development/CN=Postbox Dev CA (DO NOT TRUST)" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out ca.pem
fi

# leaf NAME SUBJECT EXTENSIONS: a key and a CA-signed certificate.
leaf() {
    local name=$1 subject=$2 ext=$3
    if ! $force && [ -f "$name.pem" ] && [ -f "$name.key" ]; then return; fi
    key "$name.key"
    openssl req -new -key "$name.key" -subj "$subject" -out "$tmp/$name.csr"
    printf '%s\n' "$ext" > "$tmp/$name.ext"
    openssl x509 -req -in "$tmp/$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -CAserial "$tmp/ca.srl" -sha256 -days "$DAYS" -extfile "$tmp/$name.ext" -out "$name.pem"
}

leaf server "/O=Postbox development/CN=localhost" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid"

leaf client "/O=Postbox development/CN=postbox-dev-client" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid"

for sensor in sensor1 sensor2; do
leaf "$sensor" "/O=Postbox development/CN=$sensor" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid"
done

chmod 644 ./*.key ./*.pem   # readable by test processes and containers; dev keys are public anyway

openssl verify -CAfile ca.pem server.pem client.pem sensor1.pem sensor2.pem
