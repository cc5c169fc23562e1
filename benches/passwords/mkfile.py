import hashlib, os, base64, sys
# Writes N users userI/pwI as mosquitto_passwd-style $7$ lines: python3 mkfile.py N ITERATIONS FILE
n, iters, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(out, "w") as f:
    for i in range(n):
        salt = os.urandom(12)
        h = hashlib.pbkdf2_hmac("sha512", f"pw{i}".encode(), salt, iters, 64)
        f.write(f"user{i}:$7${iters}${base64.b64encode(salt).decode()}${base64.b64encode(h).decode()}\n")
