#!/usr/bin/env bash
# Regenerates the DEVELOPMENT-ONLY JWT signing keys in this folder (tests sign tokens with
# them; `[auth.jwt] public_key` / `jwks` point at the public halves):
#   rsa.key / rsa.pub   RSA 2048 (RS256)     ec.key / ec.pub   EC P-256 (ES256)
#   jwks.json           both public keys as a JWKS, kid "rsa-dev" and "ec-dev"
# The private keys are committed on purpose: never use these files in production.
set -euo pipefail
command -v openssl >/dev/null || { echo "gen.sh: openssl not found" >&2; exit 1; }
command -v python3 >/dev/null || { echo "gen.sh: python3 not found (for jwks.json)" >&2; exit 1; }
cd "$(dirname "$0")"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.key
openssl pkey -in rsa.key -pubout -out rsa.pub
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.key
openssl pkey -in ec.key -pubout -out ec.pub
b64url() { python3 -c 'import sys,base64;print(base64.urlsafe_b64encode(bytes.fromhex(sys.stdin.read().strip())).decode().rstrip("="))'; }
n=$(openssl rsa -pubin -in rsa.pub -noout -modulus | cut -d= -f2 | b64url)
e=$(printf '%06x' 65537 | b64url)
# The uncompressed EC point: 04 || x || y, the last 65 bytes of the DER public key.
point=$(openssl pkey -pubin -in ec.pub -outform DER | tail -c 65 | od -An -v -tx1 | tr -d ' \n')
x=$(echo "${point:2:64}" | b64url)
y=$(echo "${point:66:64}" | b64url)
cat > jwks.json <<EOJ
{"keys": [
  {"kty": "RSA", "kid": "rsa-dev", "alg": "RS256", "use": "sig", "n": "$n", "e": "$e"},
  {"kty": "EC", "kid": "ec-dev", "alg": "ES256", "use": "sig", "crv": "P-256", "x": "$x", "y": "$y"}
]}
EOJ
echo "wrote rsa.key rsa.pub ec.key ec.pub jwks.json"
