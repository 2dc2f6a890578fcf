"""TLS and basic auth for the exporter's own endpoints, in the Prometheus
exporter-toolkit web-config file format (``--web.config.file``), with its semantics
(github.com/prometheus/exporter-toolkit, web/tls_config.go and web/handler.go):

    tls_server_config:
      cert_file: server.crt                          # or cert: <PEM> inline is refused (see below)
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default) or VerifyClientCertIfGiven;
                                                     # RequestClientCert, RequireAnyClientCert: refused
      client_ca_file: ca.crt                         # or client_ca: <PEM>
      client_allowed_sans: [prometheus.monitoring]   # the client cert must carry one of these SANs (IPs: any spelling)
      min_version: TLS12                             # TLS12 (default) or TLS13
      max_version: TLS13                             # TLS12 or TLS13 (default)
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go names; TLS 1.3 suites as in Go: fixed
      prefer_server_cipher_suites: true              # default true
      curve_preferences: [X25519]                    # one curve: Python's ssl sets no list of them
    http_server_config:
      headers: {X-Frame-Options: deny}               # the toolkit's five security headers
      http2: false                                   # this server speaks HTTP/1.1 only: true is refused
    rate_limit: {interval: 100ms, burst: 10}         # token bucket per client address, 429 beyond it
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes, as htpasswd -B makes

Anything the exporter cannot honour is a config error naming the key, never ignored.
The file and every file it names are re-read when they change (checked at most once
a second, on new connections and requests): new connections get the new
certificate, open ones keep theirs. The config fails closed, as exporter-toolkit's
never falls back to plaintext: a reload that does not load, or that would weaken
the config (turn TLS off, remove every user, stop requiring or verifying client
certificates, drop client_allowed_sans, lower min_version, remove or loosen
rate_limit, remove or change a header), keeps the last good config and logs one
error line naming the file; a deliberate weakening takes a restart. An unchanged
refused file is not read again. /healthz and /readyz stay open: a kubelet probe
carries no password, and neither says anything about vLLM.

One job per module (as exporter-toolkit's web/ package splits them):

    files.py       reading the web config and the files it names: regular files only, capped
    tls.py         tls_server_config -> an SSLContext: versions, ciphers, curves, client-cert
                   modes, client_allowed_sans in every form a certificate's SAN can take
    load.py        the file -> a WebConfig value, every key checked (headers, rate_limit, users)
    auth.py        basic auth: credentials, bcrypt off the event loop, bounded and taking turns
    reload.py      LiveWebConfig: re-read on change, every weakening refused (``weakenings``)
    limits.py      rate_limit's token buckets, per client address
    middleware.py  the aiohttp middleware: open paths, rate limit, basic auth, headers

Each imports only its siblings above it in that list and the package's leaves (config,
errors, yamlsafe): nothing here imports the server, the app or the pollers.
"""
