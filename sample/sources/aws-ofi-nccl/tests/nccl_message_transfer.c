/*
 * Sends buffers of growing size through the plugin and checks what arrives.
 */

#include "test-common.h"

#include <string.h>

int main(int argc, char **argv)
{
	int rank, ndev, errors = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);

	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.init(test_logger));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.devices(&ndev));
	char handle[NCCL_NET_HANDLE_MAXSIZE];
	void *listen_comm, *send_comm, *recv_comm;
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.listen(0, handle, &listen_comm));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.connect(0, handle, &send_comm));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.accept(listen_comm, &recv_comm));

	for (int bytes = 1; bytes <= (1 << 20); bytes *= 4) {
		char *out = malloc((size_t)bytes), *in = calloc(1, (size_t)bytes);
		void *send_req, *recv_req;
		int got = 0;
		for (int i = 0; i < bytes; i++)
			out[i] = (char)(i * 31 + rank);
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.irecv(recv_comm, in, bytes, NULL, &recv_req));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.isend(send_comm, out, bytes, NULL, &send_req));
		wait_request(send_req, NULL);
		wait_request(recv_req, &got);
		if (got != bytes || memcmp(in, out, (size_t)bytes) != 0) {
			fprintf(stderr, "Rank %d: transfer of %d bytes corrupted\n", rank, bytes);
			errors++;
		}
		free(out);
		free(in);
	}
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeSend(send_comm));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeRecv(recv_comm));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeListen(listen_comm));
	if (errors == 0)
		printf("Test completed successfully for rank %d\n", rank);
	MPI_Finalize();
	return errors ? 1 : 0;
}
