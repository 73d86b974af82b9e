/*
 * fuzz_headers — header values the engine parses: Idempotency-Key
 * (RFC 8941 sf-string or token), client idempotency ids, --listen values,
 * Prefer (RFC 7240 wait).  A key that parses must be 1..255 printable ASCII;
 * a wait is -1 or 0..100000000.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/identity.h"
#include "http/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    char key[256];
    if (http_sf_string(s, key, sizeof key) == 0) {
        size_t n = strlen(key);
        if (n < 1 || n > 255)
            abort();
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e)
                abort();
        if (!identity_client_key_valid(key))
            abort();
    }
    long wait = http_prefer_wait(s);
    if (wait < -1 || wait > 100000000)
        abort();
    char host[128];
    unsigned port;
    if (http_parse_listen(s, host, sizeof host, &port) == 0 && port > 65535)
        abort();
    free(s);
    return 0;
}
