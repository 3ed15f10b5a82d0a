/*
 * A sticky A/B test that still caches: the C port of policies/ab-test
 * (same cookie, headers and cache key).
 *
 * The bucket comes from the cookie `inlay_ab` (`a` or `b`). A client
 * without a valid cookie gets a bucket derived from a hash of its IP and
 * `User-Agent`, and the cookie is set on delivery. The origin sees the
 * bucket as `x-ab-bucket`; the bucket is added to the cache key. The
 * `inlay_ab` cookie is removed from the request; other cookies still pass.
 */
#include <stdlib.h>
#include <string.h>

#include "inlay_policy.h"

/** The cookie holding the bucket. */
#define COOKIE "inlay_ab"
/** The request header the origin reads the bucket from. */
#define BUCKET_HEADER "x-ab-bucket"
/** Marks a bucket assigned by this request, so on_deliver sets the cookie. */
#define NEW_BUCKET_HEADER "x-ab-new"
/** How long the cookie lives: 30 days (30 * 24 * 3600 seconds). */
#define COOKIE_MAX_AGE "2592000"

static uint64_t fnv1a(uint64_t hash, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        hash ^= (unsigned char)s[i];
        hash *= 0x00000100000001b3ULL;
    }
    return hash;
}

/** FNV-1a (64-bit) of IP, a zero byte and user agent; even hashes go to `a`. */
static const char *assign_bucket(const char *client_ip, const char *user_agent) {
    uint64_t hash = fnv1a(0xcbf29ce484222325ULL, client_ip, strlen(client_ip));
    hash = fnv1a(hash, "", 1);
    hash = fnv1a(hash, user_agent, strlen(user_agent));
    return hash % 2 == 0 ? "a" : "b";
}

/** Set a request header whose value we built; log if the host refuses it. */
static void set(inlay_request_t req, const char *name, const char *value) {
    char *err = NULL;
    if (!inlay_req_set_header(req, name, value, &err)) {
        inlay_log_warn("could not set ", name, ": ", err);
        free(err);
    }
}

inlay_action_t inlay_on_request(inlay_request_t req) {
    // Only this policy may set the marker, never the client.
    inlay_req_remove_header(req, NEW_BUCKET_HEADER);
    char *cookie = inlay_req_cookie(req, COOKIE);
    const char *bucket;
    if (cookie != NULL && strcmp(cookie, "a") == 0) {
        bucket = "a";
    } else if (cookie != NULL && strcmp(cookie, "b") == 0) {
        bucket = "b";
    } else {
        char *ip = inlay_req_client_ip(req);
        char *ua = inlay_req_header(req, "user-agent");
        bucket = assign_bucket(ip, ua != NULL ? ua : "");
        free(ip);
        free(ua);
        set(req, NEW_BUCKET_HEADER, "1");
    }
    free(cookie);
    inlay_req_remove_cookie(req, COOKIE);
    set(req, BUCKET_HEADER, bucket);
    char *key = INLAY_CONCAT("ab=", bucket);
    inlay_req_add_to_cache_key(req, key);
    free(key);
    return inlay_builtin_recv(req);
}

void inlay_on_deliver(inlay_request_t req, inlay_response_t resp) {
    char *marker = inlay_req_header(req, NEW_BUCKET_HEADER);
    if (marker == NULL) {
        return;
    }
    free(marker);
    char *bucket = inlay_req_header(req, BUCKET_HEADER);
    if (bucket == NULL) {
        return;
    }
    char *value =
        INLAY_CONCAT(COOKIE "=", bucket, "; Path=/; Max-Age=" COOKIE_MAX_AGE "; SameSite=Lax");
    char *err = NULL;
    if (!inlay_resp_append_header(resp, "set-cookie", value, &err)) {
        inlay_log_warn("could not set the A/B cookie: ", err);
        free(err);
    }
    free(value);
    free(bucket);
}
