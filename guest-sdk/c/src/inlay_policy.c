/*
 * The C SDK for Inlay policies (see include/inlay_policy.h): string and
 * memory handling over the generated bindings, the built-in rules, and the
 * handler exports forwarding to the policy's hooks.
 */
#include "inlay_policy.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* --- strings -------------------------------------------------------------- */

/** A borrowed view of a NUL-terminated string, for import arguments. */
static policy_string_t view(const char *s) {
    return (policy_string_t){(uint8_t *)s, strlen(s)};
}

/** Out of memory: trap (the host fails this request alone). */
static void *checked(void *p) {
    if (p == NULL) {
        abort();
    }
    return p;
}

static char *copy_bytes(const void *bytes, size_t len) {
    char *out = checked(malloc(len + 1));
    memcpy(out, bytes, len);
    out[len] = '\0';
    return out;
}

/**
 * Turn a string the host returned (owned, from cabi_realloc, not
 * NUL-terminated) into a NUL-terminated one from malloc. An empty string
 * has no allocation behind it (cabi_realloc returns the alignment).
 */
static char *take(policy_string_t *s) {
    if (s->len == 0) {
        return copy_bytes("", 0);
    }
    char *out = checked(realloc(s->ptr, s->len + 1));
    out[s->len] = '\0';
    return out;
}

/** Hand a host error message to the caller, or free it. */
static void take_err(policy_string_t *message, char **err) {
    if (err != NULL) {
        *err = take(message);
    } else {
        policy_string_free(message);
    }
}

static inlay_strings_t take_list(policy_list_string_t *list) {
    inlay_strings_t out = {NULL, list->len};
    if (list->len > 0) {
        out.items = checked(malloc(list->len * sizeof(char *)));
        for (size_t i = 0; i < list->len; i++) {
            out.items[i] = take(&list->ptr[i]);
        }
        free(list->ptr);
    }
    return out;
}

void inlay_strings_free(inlay_strings_t *strings) {
    for (size_t i = 0; i < strings->len; i++) {
        free(strings->items[i]);
    }
    free(strings->items);
    strings->items = NULL;
    strings->len = 0;
}

/* --- actions -------------------------------------------------------------- */

inlay_action_t inlay_action_lookup(void) {
    return (inlay_action_t){.tag = INLAY_POLICY_TYPES_REQUEST_ACTION_LOOKUP};
}

inlay_action_t inlay_action_pass(void) {
    return (inlay_action_t){.tag = INLAY_POLICY_TYPES_REQUEST_ACTION_PASS};
}

inlay_action_t inlay_action_synthetic(uint16_t status, const void *body, size_t len) {
    inlay_action_t action = {.tag = INLAY_POLICY_TYPES_REQUEST_ACTION_SYNTHETIC};
    action.val.synthetic.status = status;
    if (len > 0) {
        action.val.synthetic.body.ptr = checked(malloc(len));
        memcpy(action.val.synthetic.body.ptr, body, len);
        action.val.synthetic.body.len = len;
    }
    return action;
}

bool inlay_action_add_header(inlay_action_t *action, const char *name, const char *value) {
    if (action->tag != INLAY_POLICY_TYPES_REQUEST_ACTION_SYNTHETIC) {
        return false;
    }
    inlay_policy_types_headers_t *headers = &action->val.synthetic.headers;
    headers->ptr = checked(realloc(headers->ptr, (headers->len + 1) * sizeof(*headers->ptr)));
    size_t name_len = strlen(name), value_len = strlen(value);
    char *lower = copy_bytes(name, name_len);
    for (size_t i = 0; i < name_len; i++) {
        if (lower[i] >= 'A' && lower[i] <= 'Z') {
            lower[i] = (char)(lower[i] - 'A' + 'a');
        }
    }
    // The bindings free non-empty strings after the hook returns.
    headers->ptr[headers->len].f0 = (policy_string_t){(uint8_t *)lower, name_len};
    headers->ptr[headers->len].f1 =
        (policy_string_t){(uint8_t *)copy_bytes(value, value_len), value_len};
    headers->len++;
    return true;
}

inlay_action_t inlay_action_redirect(uint16_t status, const char *location) {
    inlay_action_t action = inlay_action_synthetic(status, NULL, 0);
    inlay_action_add_header(&action, "location", location);
    return action;
}

/* --- the request ---------------------------------------------------------- */

char *inlay_req_method(inlay_request_t req) {
    policy_string_t ret;
    inlay_policy_types_method_request_method(req, &ret);
    return take(&ret);
}

void inlay_req_set_method(inlay_request_t req, const char *method) {
    policy_string_t m = view(method);
    inlay_policy_types_method_request_set_method(req, &m);
}

char *inlay_req_url(inlay_request_t req) {
    policy_string_t ret;
    inlay_policy_types_method_request_url(req, &ret);
    return take(&ret);
}

bool inlay_req_set_url(inlay_request_t req, const char *url, char **err) {
    policy_string_t u = view(url), message;
    if (inlay_policy_types_method_request_set_url(req, &u, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

char *inlay_req_header(inlay_request_t req, const char *name) {
    policy_string_t n = view(name), ret;
    return inlay_policy_types_method_request_header(req, &n, &ret) ? take(&ret) : NULL;
}

inlay_strings_t inlay_req_header_all(inlay_request_t req, const char *name) {
    policy_string_t n = view(name);
    policy_list_string_t ret;
    inlay_policy_types_method_request_header_all(req, &n, &ret);
    return take_list(&ret);
}

bool inlay_req_set_header(inlay_request_t req, const char *name, const char *value, char **err) {
    policy_string_t n = view(name), v = view(value), message;
    if (inlay_policy_types_method_request_set_header(req, &n, &v, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

bool inlay_req_append_header(inlay_request_t req, const char *name, const char *value, char **err) {
    policy_string_t n = view(name), v = view(value), message;
    if (inlay_policy_types_method_request_append_header(req, &n, &v, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

void inlay_req_remove_header(inlay_request_t req, const char *name) {
    policy_string_t n = view(name);
    inlay_policy_types_method_request_remove_header(req, &n);
}

char *inlay_req_client_ip(inlay_request_t req) {
    policy_string_t ret;
    inlay_policy_types_method_request_client_ip(req, &ret);
    return take(&ret);
}

char *inlay_req_backend(inlay_request_t req) {
    policy_string_t ret;
    inlay_policy_types_method_request_backend(req, &ret);
    return take(&ret);
}

bool inlay_req_set_backend(inlay_request_t req, const char *name, char **err) {
    policy_string_t n = view(name), message;
    if (inlay_policy_types_method_request_set_backend(req, &n, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

void inlay_req_add_to_cache_key(inlay_request_t req, const char *data) {
    policy_string_t d = view(data);
    inlay_policy_types_method_request_add_to_cache_key(req, &d);
}

/* Cookies: `name=value` pieces split on `;`, trimmed, empty ones skipped. */

/**
 * The length of the Unicode White_Space character (what Rust's `str::trim`
 * removes) encoded in UTF-8 at `p`, with `avail` bytes there; 0 if none.
 */
static size_t space_len(const unsigned char *p, size_t avail) {
    if (avail >= 1 && (p[0] == ' ' || (p[0] >= '\t' && p[0] <= '\r'))) {
        return 1;
    }
    if (avail >= 2 && p[0] == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0)) {
        return 2; /* U+0085, U+00A0 */
    }
    if (avail >= 3) {
        unsigned a = p[0], b = p[1], c = p[2];
        if ((a == 0xE1 && b == 0x9A && c == 0x80) ||                 /* U+1680 */
            (a == 0xE2 && b == 0x80 && (c <= 0x8A || c == 0xA8 || c == 0xA9 || c == 0xAF)) ||
            (a == 0xE2 && b == 0x81 && c == 0x9F) ||                 /* U+205F */
            (a == 0xE3 && b == 0x80 && c == 0x80)) {                 /* U+3000 */
            return 3; /* c >= 0x80 holds for every continuation byte */
        }
    }
    return 0;
}

/** Trim Unicode white space off both ends of [*start, *end). */
static void trim(const char **start, const char **end) {
    size_t n;
    while (*start < *end &&
           (n = space_len((const unsigned char *)*start, (size_t)(*end - *start))) > 0) {
        *start += n;
    }
    bool more = true;
    while (more && *end > *start) {
        more = false;
        for (size_t k = 1; k <= 3 && k <= (size_t)(*end - *start); k++) {
            if (space_len((const unsigned char *)*end - k, k) == k) {
                *end -= k;
                more = true;
                break;
            }
        }
    }
}

/** The next trimmed, non-empty piece of a Cookie line; false at the end. */
static bool next_pair(const char **cursor, const char **start, const char **end) {
    while (**cursor != '\0') {
        const char *s = *cursor;
        const char *e = strchr(s, ';');
        if (e == NULL) {
            e = s + strlen(s);
        }
        *cursor = *e == ';' ? e + 1 : e;
        trim(&s, &e);
        if (s < e) {
            *start = s;
            *end = e;
            return true;
        }
    }
    return false;
}

/** Whether the piece's name (before `=`, trimmed; or the whole piece) is `name`. */
static bool pair_is(const char *start, const char *end, const char *name, const char **eq) {
    const char *e = memchr(start, '=', (size_t)(end - start));
    *eq = e;
    const char *name_end = e != NULL ? e : end;
    const char *name_start = start;
    if (e != NULL) {
        trim(&name_start, &name_end);
    }
    size_t len = strlen(name);
    return (size_t)(name_end - name_start) == len && memcmp(name_start, name, len) == 0;
}

char *inlay_req_cookie(inlay_request_t req, const char *name) {
    inlay_strings_t lines = inlay_req_header_all(req, "cookie");
    char *found = NULL;
    for (size_t i = 0; i < lines.len && found == NULL; i++) {
        const char *cursor = lines.items[i], *start, *end, *eq;
        while (found == NULL && next_pair(&cursor, &start, &end)) {
            if (pair_is(start, end, name, &eq)) {
                if (eq == NULL) {
                    found = copy_bytes("", 0);
                } else {
                    const char *vs = eq + 1, *ve = end;
                    trim(&vs, &ve);
                    found = copy_bytes(vs, (size_t)(ve - vs));
                }
            }
        }
    }
    inlay_strings_free(&lines);
    return found;
}

bool inlay_req_remove_cookie(inlay_request_t req, const char *name) {
    inlay_strings_t lines = inlay_req_header_all(req, "cookie");
    size_t total = 0;
    for (size_t i = 0; i < lines.len; i++) {
        total += strlen(lines.items[i]) + 2;
    }
    char *kept = checked(malloc(total + 1));
    size_t len = 0;
    bool found = false;
    for (size_t i = 0; i < lines.len; i++) {
        const char *cursor = lines.items[i], *start, *end, *eq;
        while (next_pair(&cursor, &start, &end)) {
            if (pair_is(start, end, name, &eq)) {
                found = true;
                continue;
            }
            if (len > 0) {
                memcpy(kept + len, "; ", 2);
                len += 2;
            }
            memcpy(kept + len, start, (size_t)(end - start));
            len += (size_t)(end - start);
        }
    }
    kept[len] = '\0';
    if (found) {
        // The pieces came from a valid header; if the host refuses the new
        // line anyway, drop the header rather than keep the cookie.
        if (len == 0 || !inlay_req_set_header(req, "cookie", kept, NULL)) {
            inlay_req_remove_header(req, "cookie");
        }
    }
    free(kept);
    inlay_strings_free(&lines);
    return found;
}

/* --- the response --------------------------------------------------------- */

uint16_t inlay_resp_status(inlay_response_t resp) {
    return inlay_policy_types_method_response_status(resp);
}

bool inlay_resp_set_status(inlay_response_t resp, uint16_t status, char **err) {
    policy_string_t message;
    if (inlay_policy_types_method_response_set_status(resp, status, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

char *inlay_resp_header(inlay_response_t resp, const char *name) {
    policy_string_t n = view(name), ret;
    return inlay_policy_types_method_response_header(resp, &n, &ret) ? take(&ret) : NULL;
}

inlay_strings_t inlay_resp_header_all(inlay_response_t resp, const char *name) {
    policy_string_t n = view(name);
    policy_list_string_t ret;
    inlay_policy_types_method_response_header_all(resp, &n, &ret);
    return take_list(&ret);
}

bool inlay_resp_set_header(inlay_response_t resp, const char *name, const char *value, char **err) {
    policy_string_t n = view(name), v = view(value), message;
    if (inlay_policy_types_method_response_set_header(resp, &n, &v, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

bool inlay_resp_append_header(inlay_response_t resp, const char *name, const char *value,
                              char **err) {
    policy_string_t n = view(name), v = view(value), message;
    if (inlay_policy_types_method_response_append_header(resp, &n, &v, &message)) {
        return true;
    }
    take_err(&message, err);
    return false;
}

void inlay_resp_remove_header(inlay_response_t resp, const char *name) {
    policy_string_t n = view(name);
    inlay_policy_types_method_response_remove_header(resp, &n);
}

/* --- capabilities --------------------------------------------------------- */

void inlay_log(inlay_log_level_t level, const char *message) {
    policy_string_t m = view(message);
    inlay_policy_log_write((inlay_policy_log_level_t)level, &m);
}

/** The strings of `args` up to a NULL, joined (from malloc). */
static char *vconcat(const char *first, va_list args) {
    va_list count;
    va_copy(count, args);
    size_t total = 0;
    for (const char *s = first; s != NULL; s = va_arg(count, const char *)) {
        total += strlen(s);
    }
    va_end(count);
    char *out = checked(malloc(total + 1));
    size_t len = 0;
    for (const char *s = first; s != NULL; s = va_arg(args, const char *)) {
        size_t n = strlen(s);
        memcpy(out + len, s, n);
        len += n;
    }
    out[len] = '\0';
    return out;
}

char *inlay_concat(const char *first, ...) {
    va_list args;
    va_start(args, first);
    char *out = vconcat(first, args);
    va_end(args);
    return out;
}

void inlay_log_parts(inlay_log_level_t level, ...) {
    va_list args;
    va_start(args, level);
    const char *first = va_arg(args, const char *);
    char *line = vconcat(first, args);
    va_end(args);
    inlay_log(level, line);
    free(line);
}

char *inlay_config_get(const char *key) {
    policy_string_t k = view(key), ret;
    return inlay_policy_config_get(&k, &ret) ? take(&ret) : NULL;
}

uint64_t inlay_clock_now_unix_ms(void) {
    return inlay_policy_clock_now_unix_ms();
}

void inlay_esi_set_enabled(bool enabled) {
    inlay_policy_esi_set_enabled(enabled);
}

void inlay_esi_set_var(const char *name, const char *value) {
    policy_string_t n = view(name), v = view(value);
    inlay_policy_esi_set_var(&n, &v);
}

/* --- built-in behaviour and the default hooks ----------------------------- */

bool inlay_builtin_is_lookup_method(const char *method) {
    return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
}

bool inlay_builtin_has_credentials(inlay_request_t req) {
    char *auth = inlay_req_header(req, "authorization");
    char *cookie = inlay_req_header(req, "cookie");
    bool has = auth != NULL || cookie != NULL;
    free(auth);
    free(cookie);
    return has;
}

/* The host decides it in one call (the rules of the two helpers above). */
inlay_action_t inlay_builtin_recv(inlay_request_t req) {
    if (inlay_policy_sdk_builtin_recv_lookup(req)) {
        return inlay_action_lookup();
    }
    return inlay_action_pass();
}

/*
 * The defaults tell the host they are the defaults: it then applies the
 * built-in rules itself and calls no instance for that hook. A policy's own
 * hook replaces the weak symbol, so it never tells, even if it ends in
 * `inlay_builtin_recv`.
 */

__attribute__((weak)) inlay_action_t inlay_on_request(inlay_request_t req) {
    inlay_policy_sdk_default_hook(INLAY_POLICY_SDK_HOOK_ON_REQUEST);
    return inlay_builtin_recv(req);
}

__attribute__((weak)) inlay_cache_settings_t inlay_on_backend_response(
    inlay_request_t req, inlay_response_t resp, inlay_cache_settings_t settings) {
    (void)req;
    (void)resp;
    inlay_policy_sdk_default_hook(INLAY_POLICY_SDK_HOOK_ON_BACKEND_RESPONSE);
    return settings;
}

__attribute__((weak)) void inlay_on_deliver(inlay_request_t req, inlay_response_t resp) {
    (void)req;
    (void)resp;
    inlay_policy_sdk_default_hook(INLAY_POLICY_SDK_HOOK_ON_DELIVER);
}

/* --- the generated exports ------------------------------------------------ */

/*
 * The canonical ABI makes a C export drop the borrowed handles it was given
 * before it returns (the host traps the call otherwise: "borrow handles
 * still remain at the end of the call"); hooks never see that chore.
 */

void exports_inlay_policy_handler_on_request(exports_inlay_policy_handler_borrow_request_t req,
                                             exports_inlay_policy_handler_request_action_t *ret) {
    *ret = inlay_on_request(req);
    inlay_policy_types_request_drop_borrow(req);
}

void exports_inlay_policy_handler_on_backend_response(
    exports_inlay_policy_handler_borrow_request_t req,
    exports_inlay_policy_handler_borrow_response_t resp,
    exports_inlay_policy_handler_cache_settings_t *settings,
    exports_inlay_policy_handler_cache_settings_t *ret) {
    // The settings (and their surrogate keys) move to the hook and back;
    // the bindings free what is returned.
    *ret = inlay_on_backend_response(req, resp, *settings);
    inlay_policy_types_request_drop_borrow(req);
    inlay_policy_types_response_drop_borrow(resp);
}

void exports_inlay_policy_handler_on_deliver(exports_inlay_policy_handler_borrow_request_t req,
                                             exports_inlay_policy_handler_borrow_response_t resp) {
    inlay_on_deliver(req, resp);
    inlay_policy_types_request_drop_borrow(req);
    inlay_policy_types_response_drop_borrow(resp);
}
