/* group_impl.h — what the leader (group_leader.c) and the ranks
 * (group_rank.c) of a verifier group share; see group.c. */
#ifndef SPECD_GROUP_IMPL_H
#define SPECD_GROUP_IMPL_H

#include "group.h"

#include <stdbool.h>
#include <stdint.h>

#define SD_GROUP_NCCL_ID_MAX 1024
#define SD_GROUP_REASON_MAX  512

/* This host's name (for the one-host check of shared-memory collectives). */
void sd_group_host_name(char *out, size_t n);
/* Inode of this process's pid namespace (0 when unknown). */
uint64_t sd_group_pid_ns(void);
/* True when process pid (in our pid namespace) no longer runs: gone, or a
 * zombie its parent has not reaped yet. */
bool sd_group_pid_gone(int32_t pid);
/* True when poll reported fd readable (or closed). */
bool sd_group_readable(int fd, short revents);
/* Fills a ModelIdentity message borrowing m's strings. */
void sd_group_identity_init(Specd__ModelIdentity *id, const sd_model_identity *m);
/* Checks group parameters for the leader (rank 0) or a rank; logs why not. */
sd_status sd_group_check_params(const sd_group_params *p, bool leader);

#endif
