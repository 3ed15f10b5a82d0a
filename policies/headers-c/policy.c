/*
 * Header hygiene, the C port of policies/headers (same behaviour): strips
 * tracking query parameters (`utm_*`, `fbclid`, `gclid`) before the cache
 * lookup, so they do not split the cache or reach the origin; on delivery
 * removes `Server` and `X-Powered-By` and adds `x-inlay-policy: headers`.
 */
#include <stdlib.h>
#include <string.h>

#include "inlay_policy.h"

static char ascii_lower(char c) {
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/** Whether [name, name+len) equals `word` ignoring ASCII case. */
static bool equals_ascii_ci(const char *name, size_t len, const char *word) {
    if (strlen(word) != len) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (ascii_lower(name[i]) != word[i]) {
            return false;
        }
    }
    return true;
}

/** Whether the parameter [param, param+len) is a tracking one (by its name). */
static bool is_tracking(const char *param, size_t len) {
    const char *eq = memchr(param, '=', len);
    size_t name_len = eq != NULL ? (size_t)(eq - param) : len;
    return (name_len >= 4 && equals_ascii_ci(param, 4, "utm_")) ||
           equals_ascii_ci(param, name_len, "fbclid") || equals_ascii_ci(param, name_len, "gclid");
}

/**
 * `url` without tracking query parameters, the others kept in order and
 * exact text; the `?` goes when none is left. NULL when unchanged.
 */
static char *strip_tracking_params(const char *url) {
    const char *query = strchr(url, '?');
    if (query == NULL) {
        return NULL;
    }
    query++;
    bool any = false;
    for (const char *p = query;;) {
        const char *amp = strchr(p, '&');
        size_t len = amp != NULL ? (size_t)(amp - p) : strlen(p);
        any = any || is_tracking(p, len);
        if (amp == NULL) {
            break;
        }
        p = amp + 1;
    }
    if (!any) {
        return NULL;
    }
    size_t path_len = (size_t)(query - 1 - url);
    char *out = malloc(strlen(url) + 1);
    if (out == NULL) {
        abort();
    }
    memcpy(out, url, path_len);
    size_t len = path_len;
    bool first = true;
    for (const char *p = query;;) {
        const char *amp = strchr(p, '&');
        size_t plen = amp != NULL ? (size_t)(amp - p) : strlen(p);
        if (plen > 0 && !is_tracking(p, plen)) {
            out[len++] = first ? '?' : '&';
            memcpy(out + len, p, plen);
            len += plen;
            first = false;
        }
        if (amp == NULL) {
            break;
        }
        p = amp + 1;
    }
    out[len] = '\0';
    return out;
}

inlay_action_t inlay_on_request(inlay_request_t req) {
    char *url = inlay_req_url(req);
    char *clean = strip_tracking_params(url);
    if (clean != NULL) {
        char *err = NULL;
        if (!inlay_req_set_url(req, clean, &err)) {
            // A sub-string of a valid URL: not expected; the original stays.
            inlay_log_warn("could not strip tracking parameters: ", err);
            free(err);
        }
        free(clean);
    }
    free(url);
    return inlay_builtin_recv(req);
}

void inlay_on_deliver(inlay_request_t req, inlay_response_t resp) {
    (void)req;
    inlay_resp_remove_header(resp, "server");
    inlay_resp_remove_header(resp, "x-powered-by");
    char *err = NULL;
    if (!inlay_resp_set_header(resp, "x-inlay-policy", "headers", &err)) {
        inlay_log_warn("could not set x-inlay-policy: ", err);
        free(err);
    }
}
