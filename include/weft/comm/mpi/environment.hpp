// weft/comm/mpi/environment.hpp — optional RAII for programs that own MPI: MPI_Init_thread when
// MPI is not initialised yet, MPI_Finalize at the end if this object initialised it.
#pragma once

#if !WEFT_HAS_MPI
#error \
    "weft/comm/mpi/environment.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/core/error.hpp>

#include <mpi.h>

namespace weft::comm::mpi {

//! Optional RAII for programs that own MPI: MPI_Init_thread in the constructor (if MPI is not
//! initialised yet), MPI_Finalize in the destructor (if this object initialised it).
class environment {
 public:
  environment(int* argc, char*** argv, int required = MPI_THREAD_SERIALIZED) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited != 0) return;
    int provided = 0;
    WEFT_MPI_TRY(MPI_Init_thread(argc, argv, required, &provided));
    owner_ = true;
    provided_ = provided;
  }
  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;
  ~environment() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (owner_ && fin == 0) MPI_Finalize();
  }
  [[nodiscard]] int provided() const noexcept { return provided_; }

 private:
  bool owner_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

}  // namespace weft::comm::mpi
