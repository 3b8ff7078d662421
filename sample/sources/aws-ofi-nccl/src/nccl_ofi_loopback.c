/*
 * In-process transport: a listen handle carries the address of the listening channel and the
 * pid that owns it; connect and accept attach to that channel, isend queues a copy of the
 * buffer and irecv takes it. A handle from another process is refused.
 */

#include "nccl_ofi.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOOP_MAGIC 0x4f46494c4f4f5031ULL

struct message {
	struct message *next;
	int size;
	char data[];
};

struct channel {
	pthread_mutex_t lock;
	struct message *head, *tail;
	int refs;
};

struct comm {
	uint64_t magic;
	int dev;
	int is_send;
	struct channel *chan;
};

struct handle {
	uint64_t magic;
	int64_t pid;
	struct comm *listen;
};

struct request {
	struct comm *comm;
	void *data;
	int size;
	int done;
};

static struct comm *new_comm(int dev, int is_send, struct channel *chan)
{
	struct comm *comm = calloc(1, sizeof(*comm));
	if (comm == NULL)
		return NULL;
	comm->magic = LOOP_MAGIC;
	comm->dev = dev;
	comm->is_send = is_send;
	comm->chan = chan;
	pthread_mutex_lock(&chan->lock);
	chan->refs++;
	pthread_mutex_unlock(&chan->lock);
	return comm;
}

ncclResult_t nccl_ofi_loop_listen(int dev, void *opaque_handle, void **listen_comm)
{
	struct channel *chan = calloc(1, sizeof(*chan));
	if (chan == NULL)
		return ncclSystemError;
	pthread_mutex_init(&chan->lock, NULL);
	struct comm *comm = new_comm(dev, 0, chan);
	if (comm == NULL) {
		free(chan);
		return ncclSystemError;
	}
	struct handle handle = { LOOP_MAGIC, (int64_t)getpid(), comm };
	memset(opaque_handle, 0, NCCL_NET_HANDLE_MAXSIZE);
	memcpy(opaque_handle, &handle, sizeof(handle));
	*listen_comm = comm;
	return ncclSuccess;
}

ncclResult_t nccl_ofi_loop_connect(int dev, void *opaque_handle, void **send_comm)
{
	struct handle handle;
	memcpy(&handle, opaque_handle, sizeof(handle));
	if (handle.magic != LOOP_MAGIC || handle.pid != (int64_t)getpid()) {
		NCCL_OFI_WARN("Connection handle is not from this process: the sample transport is in-process only");
		return ncclInternalError;
	}
	*send_comm = new_comm(dev, 1, handle.listen->chan);
	return *send_comm ? ncclSuccess : ncclSystemError;
}

ncclResult_t nccl_ofi_loop_accept(void *listen_comm, void **recv_comm)
{
	struct comm *listen = listen_comm;
	*recv_comm = new_comm(listen->dev, 0, listen->chan);
	return *recv_comm ? ncclSuccess : ncclSystemError;
}

ncclResult_t nccl_ofi_loop_isend(void *send_comm, void *data, int size, void *mhandle, void **request)
{
	(void)mhandle;
	struct comm *comm = send_comm;
	struct message *msg = malloc(sizeof(*msg) + (size_t)size);
	struct request *req = calloc(1, sizeof(*req));
	if (msg == NULL || req == NULL) {
		free(msg);
		free(req);
		return ncclSystemError;
	}
	msg->next = NULL;
	msg->size = size;
	memcpy(msg->data, data, (size_t)size);
	pthread_mutex_lock(&comm->chan->lock);
	if (comm->chan->tail)
		comm->chan->tail->next = msg;
	else
		comm->chan->head = msg;
	comm->chan->tail = msg;
	pthread_mutex_unlock(&comm->chan->lock);
	req->comm = comm;
	req->size = size;
	req->done = 1;
	*request = req;
	return ncclSuccess;
}

ncclResult_t nccl_ofi_loop_irecv(void *recv_comm, void *data, int size, void *mhandle, void **request)
{
	(void)mhandle;
	struct request *req = calloc(1, sizeof(*req));
	if (req == NULL)
		return ncclSystemError;
	req->comm = recv_comm;
	req->data = data;
	req->size = size;
	*request = req;
	return ncclSuccess;
}

/* Completes a receive if a message is queued; frees the request once it is done. */
ncclResult_t nccl_ofi_loop_test(void *request, int *done, int *size)
{
	struct request *req = request;
	ncclResult_t ret = ncclSuccess;
	if (!req->done) {
		struct channel *chan = req->comm->chan;
		pthread_mutex_lock(&chan->lock);
		struct message *msg = chan->head;
		if (msg != NULL) {
			chan->head = msg->next;
			if (chan->head == NULL)
				chan->tail = NULL;
		}
		pthread_mutex_unlock(&chan->lock);
		if (msg != NULL) {
			if (msg->size > req->size) {
				NCCL_OFI_WARN("Message of %d bytes truncated to %d", msg->size, req->size);
				ret = ncclInternalError;
			} else {
				memcpy(req->data, msg->data, (size_t)msg->size);
				req->size = msg->size;
			}
			req->done = 1;
			free(msg);
		}
	}
	*done = req->done;
	if (req->done) {
		if (size)
			*size = req->size;
		free(req);
	}
	return ret;
}

ncclResult_t nccl_ofi_loop_close(void *opaque_comm)
{
	struct comm *comm = opaque_comm;
	if (comm == NULL || comm->magic != LOOP_MAGIC)
		return ncclInternalError;
	struct channel *chan = comm->chan;
	pthread_mutex_lock(&chan->lock);
	int last = --chan->refs == 0;
	pthread_mutex_unlock(&chan->lock);
	if (last) {
		while (chan->head) {
			struct message *next = chan->head->next;
			free(chan->head);
			chan->head = next;
		}
		pthread_mutex_destroy(&chan->lock);
		free(chan);
	}
	comm->magic = 0;
	free(comm);
	return ncclSuccess;
}
