/* client_wire.h — libspecd-client's mapping between the protocol's
 * messages (proto/specd.proto) and the API's structs (specd/client.h), in
 * client_wire.c: pure functions, no socket, no lock. client.c calls them
 * from the I/O thread (replies) and the caller's thread (Submit). */
#ifndef SPECD_CLIENT_WIRE_H
#define SPECD_CLIENT_WIRE_H

#include "specd/client.h"

/* The API status of an Error reply's code. */
sd_status sd_client_wire_status(Specd__Code code);

/* *o = the service stats s says (workers past SD_CLIENT_MAX_WORKERS left
 * out); *o is cleared first. */
void sd_client_wire_service_stats(const Specd__ServiceStats *s, sd_client_service_stats *o);

/* *o = the per-request figures of a Finished reply. */
void sd_client_wire_request_stats(const Specd__RequestStats *s, sd_client_request_stats *o);

/* rq's conversation in protobuf form, at most SD_MAX_CHAT_MESSAGES + 1
 * turns (more still reach validation, which names the limit): *messages
 * (n_messages pointers into *storage), both NULL for no turns; strings are
 * borrowed from rq. The caller frees *messages and *storage. SD_OK or
 * SD_ERR_NOMEM. */
sd_status sd_client_wire_messages(const sd_client_request *rq, Specd__ChatMessage ***messages,
                                  Specd__ChatMessage **storage, size_t *n_messages);

/* Fills *sub (initialised here) from rq, with messages (n_messages turns,
 * or NULL) and *smp (rq's sampling, filled here) borrowed: valid while rq,
 * messages and smp are. client_tag is left 0. */
/* Points sub at rq's constraint, written into *con (none: untouched). */
void sd_client_wire_constraint(const sd_client_request *rq, Specd__Constraint *con, Specd__SubmitRequest *sub);
void sd_client_wire_submit(const sd_client_request *rq, Specd__ChatMessage **messages, size_t n_messages,
                           Specd__Sampling *smp, Specd__SubmitRequest *sub);

#endif
