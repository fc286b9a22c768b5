#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/links/link.h"
#include "transport/messaging/message_book.h"
#include "transport/messaging/out_frame.h"

namespace railshard::transport::messaging {

// One large message moved in place over the one-sided links (messenger_rendezvous.cc).
struct Rendezvous {
  bool finished = false;  // its one-sided part is done
};

}  // namespace railshard::transport::messaging
